"""The core: what every other floor uses and that uses nothing of them (no I/O beyond a file named
to it): errors and exit codes, byte sizes, key specs, thresholds and the one selection type with its
recipes, the stream's markers, the tally of drops, working folders, a URL as it may be shown, the
progress line."""
