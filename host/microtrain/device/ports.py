"""Serial ports: which exist, and which one is the MicroPython board."""
from __future__ import annotations

from .errors import NoDevice

# ADAPTER(boards): USB ids of MicroPython boards, until host/microtrain/boards.py (helper
# "boards") provides them with the board profiles. (vid, pid or None for any pid): what.
USB_IDS = {
    (0xF055, 0x9800): "MicroPython (pyboard and other boards with MicroPython's own USB id)",
    (0x2E8A, 0x0005): "Raspberry Pi Pico / RP2040 running MicroPython",
    (0x2E8A, 0x000C): "Raspberry Pi Pico 2 / RP2350 running MicroPython",
    (0x303A, None): "Espressif ESP32-S2/S3/C3 native USB",
    (0x10C4, 0xEA60): "CP210x USB-serial (ESP32 boards)",
    (0x1A86, 0x7523): "CH340 USB-serial (ESP32 boards)",
    (0x1A86, 0x55D4): "CH9102 USB-serial (ESP32 boards)",
    (0x0483, 0x374B): "ST-LINK virtual COM port (STM32 Nucleo boards)",
}


def _known(p):
    if p.vid is None:
        return None
    return USB_IDS.get((p.vid, p.pid)) or USB_IDS.get((p.vid, None))


def describe_ports():
    """A short list of the serial ports that exist, for error messages."""
    import serial.tools.list_ports
    ports = sorted(serial.tools.list_ports.comports(), key=lambda p: p.device)
    if not ports:
        return "no serial ports found"
    return "ports here: " + ", ".join("%s (%04x:%04x %s)" % (p.device, p.vid, p.pid, p.description)
                                      if p.vid is not None else p.device for p in ports)


def find_board():
    """The one MicroPython board connected over USB, as mpremote's `connect auto` finds
    it, but by known USB ids. NoDevice when there is none or more than one."""
    import serial.tools.list_ports
    found = [p for p in sorted(serial.tools.list_ports.comports(), key=lambda p: p.device) if _known(p)]
    if len(found) == 1:
        return found[0].device
    if not found:
        raise NoDevice("no MicroPython board found over USB (%s); connect one or give --port" % describe_ports())
    raise NoDevice("%d MicroPython boards connected (%s); choose one with --port"
                   % (len(found), ", ".join("%s: %s" % (p.device, _known(p)) for p in found)))
