"""kernelsat.proofs."""
