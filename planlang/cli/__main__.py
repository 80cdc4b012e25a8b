"""`python -m planlang.cli`."""
from planlang.cli import main

main()
