"""``python -m bench``: the scrape-path benchmark (bench/run.py).

Nothing is imported at module level: the benchmark's server processes are spawned, and a
spawned process runs this module again (as ``__mp_main__``); the enricher's process must hold
only what the enricher itself loads, or its memory figures would include the benchmark's.
"""

if __name__ == "__main__":
    import sys

    from bench.run import main

    sys.exit(main())
