"""kernelsat.learning: training and evaluating the RL extraction policy, and the corpus
of specs it trains on.

`rl_train` (policy-gradient training, measured rewards), `rl_rollouts` (rollouts run
locally or on a backend), `rl_eval` (the policy against the other extractors on held-out
specs), `corpus` (generating training specs) and `commands` (`kernelsat corpus`,
`train`, `evaluate`). Learning uses the driver the way a user would: it imports the core,
the stages and the driver, and nothing below imports it (tests/test_layers.py). RL
inference, the policy the `rl` extractor runs, stays in `kernelsat.extract` (`rl`,
`rl_policy`, `rl_env`).
"""
