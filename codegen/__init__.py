"""kernelsat.codegen."""
