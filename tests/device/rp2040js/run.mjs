// Run a Raspberry Pi Pico firmware (UF2) in the rp2040js emulator and expose MicroPython's
// REPL, which the firmware serves on USB CDC, on stdin/stdout:
//
//     node run.mjs FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]
//
// Each further UF2 is written into the flash after the firmware, at its blocks' addresses, as
// a Pico's BOOTSEL drive takes any UF2: e.g. a ROMFS image of plans at the partition of the
// firmware built by `make firmware-pico-romfs` (microtrain.romfs.to_uf2).
//
// stdin bytes go to the device as the USB host's serial writes; the device's serial output
// goes to stdout. One line "rp2040js: USB CDC connected" goes to stderr when the REPL is up.
// pty_bridge.py turns this into the pty that MicroPython's run-tests.py (execpty) drives.
// BOOTROM.ts is the RP2040 B1 boot ROM as the TypeScript array rp2040js's demo ships
// (rp2040-bootrom-B1.ts in the vendored sources, firmware/README.md): the npm package has none.
import { readFileSync } from 'node:fs';
import { Simulator, USBCDC, ConsoleLogger, LogLevel } from 'rp2040js';

const [uf2Path, bootromPath, ...moreUF2] = process.argv.slice(2);
if (!uf2Path || !bootromPath) {
  process.stderr.write('usage: node run.mjs FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]\n');
  process.exit(2);
}

// The boot ROM: every 0x........ word of the array literal.
function loadBootrom(path) {
  const text = readFileSync(path, 'utf8');
  const body = text.slice(text.indexOf('['), text.lastIndexOf(']'));
  const words = body.match(/0x[0-9a-fA-F]+/g).map((w) => parseInt(w, 16));
  if (words.length !== 4096) {
    throw new Error(`${path}: expected 4096 words of boot ROM, found ${words.length}`);
  }
  return new Uint32Array(words);
}

// UF2: 512-byte blocks, each with a target address and up to 476 bytes of payload.
const FLASH_START = 0x10000000;
function loadUF2(path, mcu) {
  const data = readFileSync(path);
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  let blocks = 0;
  for (let off = 0; off + 512 <= data.length; off += 512) {
    if (view.getUint32(off, true) !== 0x0a324655 || view.getUint32(off + 4, true) !== 0x9e5d5157) {
      throw new Error(`${path}: block at ${off} is not a UF2 block`);
    }
    const addr = view.getUint32(off + 12, true);
    const size = view.getUint32(off + 16, true);
    if (addr < FLASH_START || addr + size > FLASH_START + mcu.flash.length || size > 476) {
      throw new Error(`${path}: block at ${off} targets 0x${addr.toString(16)} (+${size}), outside the flash`);
    }
    mcu.flash.set(data.subarray(off + 32, off + 32 + size), addr - FLASH_START);
    blocks++;
  }
  if (!blocks) throw new Error(`${path}: no UF2 blocks`);
}

const sim = new Simulator();   // only for its RP2040 and clock; the loop is ours (run below)
const mcu = sim.rp2040;
mcu.logger = new ConsoleLogger(LogLevel.Error);
mcu.loadBootrom(loadBootrom(bootromPath));
loadUF2(uf2Path, mcu);
for (const path of moreUF2) loadUF2(path, mcu);

// Bytes from stdin wait here until the device is connected and its receive FIFO has room.
const pending = [];
let connected = false;
const cdc = new USBCDC(mcu.usbCtrl);
cdc.onDeviceConnected = () => {
  connected = true;
  process.stderr.write('rp2040js: USB CDC connected\n');
};
cdc.onSerialData = (buffer) => process.stdout.write(Buffer.from(buffer));
process.stdin.on('data', (chunk) => { for (const b of chunk) pending.push(b); });
process.stdin.on('end', () => process.exit(0));

function feed() {
  let n = 0;
  while (connected && n < pending.length && !cdc.txFIFO.full) {
    cdc.sendSerialByte(pending[n++]);
  }
  if (n) pending.splice(0, n);
}

// The simulator's loop (rp2040js Simulator.execute), with the feed in between: 20,000 instructions
// at a time (about 1.3 ms of host time), as stdin's bytes reach `pending` only between turns of
// node's event loop and the raw REPL's flow control waits on them (200,000: 13 ms a window).
mcu.core.PC = FLASH_START;
const clock = sim.clock;
const cycleNanos = 1e9 / 125000000;
function run() {
  for (let i = 0; i < 20000; i++) {
    if (mcu.core.waiting) {
      const { nanosToNextAlarm } = clock;
      clock.tick(nanosToNextAlarm);
      i += nanosToNextAlarm / cycleNanos;
    } else {
      clock.tick(mcu.core.executeInstruction() * cycleNanos);
    }
  }
  feed();
  setImmediate(run);
}
run();
