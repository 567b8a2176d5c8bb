"""``python -m dpaudit ...``: the same as the ``dpaudit`` command."""

from dpaudit.cli import main

if __name__ == "__main__":
    main()
