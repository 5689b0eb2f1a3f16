"""`python -m benchmarks`: run the scenarios and write results/latest.json + REPORT.md."""

from benchmarks._suite.runner import main

if __name__ == "__main__":
    raise SystemExit(main())
