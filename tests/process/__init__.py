"""Tests of the whole process: master and workers, signals, the wire, browsers, outside clients."""
