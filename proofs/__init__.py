"""kernelsat.proofs: explanations' certificates and the independent checker."""

import warnings

# `python -m kernelsat.proofs.checker` runs the checker as __main__ after `import kernelsat`
# has imported it once as a module (the package API re-exports `check`); the two copies
# share no state, so runpy's warning about it is noise on the stand-alone checker's output.
warnings.filterwarnings("ignore", message="'kernelsat.proofs.checker' found in sys.modules",
                        category=RuntimeWarning)
