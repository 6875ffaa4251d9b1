"""The scrape-path benchmark: ``python -m bench`` (see bench/README.md)."""
