"""kernelsat.rewrites."""
