# Freezes the device package `microtrain` (python/microtrain/) into firmware, next to
# the C module `_microtrain`. A port's manifest includes this file; see firmware/README.md.
package("microtrain", base_path="python")
