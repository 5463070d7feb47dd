"""kernelsat.hardware."""
