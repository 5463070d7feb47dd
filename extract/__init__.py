"""kernelsat.extract."""
