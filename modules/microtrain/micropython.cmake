# microtrain as a MicroPython user C module (CMake-based ports: esp32, rp2).
#   make -C <micropython>/ports/esp32 USER_C_MODULES=<repo>/modules/microtrain/micropython.cmake
# (USER_C_MODULES may also be this directory.)

add_library(usermod_microtrain INTERFACE)

# The portable core: every mt_*.c here, so new core files are picked up
# (CONFIGURE_DEPENDS re-globs when the build runs).
file(GLOB MICROTRAIN_CORE_SRC CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/mt_*.c)
list(SORT MICROTRAIN_CORE_SRC)

target_sources(usermod_microtrain INTERFACE
    ${CMAKE_CURRENT_LIST_DIR}/modmicrotrain.c
    ${MICROTRAIN_CORE_SRC}
)

target_include_directories(usermod_microtrain INTERFACE
    ${CMAKE_CURRENT_LIST_DIR}
)

# The core is C99. This file is include()d into the port's own directory, so
# the property applies where the sources are compiled.
if(NOT DEFINED MICROTRAIN_CORE_COMPILE_OPTIONS)
    set(MICROTRAIN_CORE_COMPILE_OPTIONS -std=c99)
endif()
if(MICROTRAIN_CORE_SRC)
    set_source_files_properties(${MICROTRAIN_CORE_SRC} PROPERTIES
        COMPILE_OPTIONS "${MICROTRAIN_CORE_COMPILE_OPTIONS}")
    # the int8 kernels at -O2 (micropython.mk says why)
    set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/mt_q8_kernels.c PROPERTIES
        COMPILE_OPTIONS "${MICROTRAIN_CORE_COMPILE_OPTIONS};-O2")
endif()

target_link_libraries(usermod INTERFACE usermod_microtrain)
