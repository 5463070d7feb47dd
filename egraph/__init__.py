"""kernelsat.egraph."""
