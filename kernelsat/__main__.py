"""`python -m kernelsat ...`: the same command line as the `kernelsat` script."""

from kernelsat.cli import main

if __name__ == "__main__":
    main()
