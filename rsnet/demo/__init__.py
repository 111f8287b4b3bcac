"""Demos: the publishers behind ``rsnet serve --demo`` (``publishers``) and ``rsnet demo``, the
live broker demo (``live``). Nothing else in rsnet imports this package."""
