"""Imported last by the test forkserver: moves every object its imports made into
the collector's permanent generation, so no forked worker's collection walks (and
copies, page by page, out of the shared memory) torch's millions of them. The fault
suites and the harness's worlds took 10-12% less CPU for it (2026-11-30)."""

import gc

gc.freeze()
