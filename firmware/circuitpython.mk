# CircuitPython 10.2.1's unix port (variant coverage: `standard` does not compile in 10.2.1)
# with the microtrain module, from the vendored sources (firmware/fetch-sources.sh
# circuitpython). Included by firmware/micropython.mk. The device package is frozen in
# through modules/microtrain/manifest.py, as in the MicroPython firmware.
CIRCUITPY_BUILD ?= $(FIRMWARE_BUILD)/circuitpython-unix
CIRCUITPY_MPY_CROSS = $(CIRCUITPY_DIR)/mpy-cross/build/mpy-cross
CIRCUITPY_ARGS ?= VARIANT=coverage FROZEN_MANIFEST=$(MICROTRAIN_MODULES_ABS)/microtrain/manifest.py

firmware-circuitpython: $(CIRCUITPY_BUILD)/.built

$(CIRCUITPY_BUILD)/microtrain.config: microtrain-firmware-force
	@$(call microtrain_config,$(@D),'$(abspath $(CIRCUITPY_DIR))' '$(CIRCUITPY_ARGS)' '$(FIRMWARE_MAKE_ARGS)' $(MICROTRAIN_MODULE_FILES))

$(CIRCUITPY_BUILD)/.built: $(MICROTRAIN_MODULE_FILES) $(MICROTRAIN_ROOT)/firmware/circuitpython.mk $(CIRCUITPY_BUILD)/microtrain.config \
		$(MICROTRAIN_FIRMWARE_PY_DEPS)
	@$(FETCH) circuitpython "$(CIRCUITPY_DIR)"
	@$(MICROTRAIN_PYTHON) -c "import huffman, polib" 2>/dev/null || { \
	    echo "microtrain: CircuitPython's build needs the PyPI packages huffman and polib (make venv-firmware)"; exit 1; }
	@# CircuitPython's makefiles run `python3`: the venv's, which has huffman and polib
	+$(if $(wildcard $(CIRCUITPY_MPY_CROSS)),true,PATH="$(dir $(abspath $(MICROTRAIN_PYTHON))):$$PATH" $(MICROTRAIN_SUBMAKE) -C "$(abspath $(CIRCUITPY_DIR))/mpy-cross")
	+PATH="$(dir $(abspath $(MICROTRAIN_PYTHON))):$$PATH" $(MICROTRAIN_SUBMAKE) -C "$(abspath $(CIRCUITPY_DIR))/ports/unix" \
	    BUILD="$(abspath $(@D))" USER_C_MODULES="$(MICROTRAIN_MODULES_ABS)" $(CIRCUITPY_ARGS) $(FIRMWARE_MAKE_ARGS)
	@touch "$@"
	@echo "microtrain: built CircuitPython in $(@D)"
