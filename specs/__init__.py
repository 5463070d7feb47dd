"""The example specs, installed as package data of `kernelsat.specs`.

The command line finds them by name when no such file exists, so an installed
kernelsat can run `kernelsat check softmax` or `kernelsat optimize attention` from
any folder: see `kernelsat.driver.commands.spec.resolve_spec`.
"""
