"""Serve the REPL of a Pico firmware running in rp2040js (run.mjs) on a pseudo-terminal,
the way `qemu-system-arm -serial pty` does, so that MicroPython's run-tests.py drives it:

    run-tests.py -t execpty:"python3 pty_bridge.py FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]"

(MORE.uf2: further images for the flash, such as a ROMFS image; run.mjs says how.)

Prints one line, "char device redirected to /dev/pts/N", once the device's USB CDC is
connected (run-tests.py reads the pty's name from it), then copies bytes both ways until
the node process ends or this process is killed. Nothing else goes to stdout: run-tests.py
never reads it again. node's diagnostics go to stderr.
"""
import os
import select
import subprocess
import sys
import tty

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: pty_bridge.py FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]")
    argv = [os.path.abspath(a) for a in argv]   # node runs in this directory (its node_modules)
    node = subprocess.Popen(["node", os.path.join(HERE, "run.mjs")] + argv, cwd=HERE,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    master, slave = os.openpty()
    tty.setraw(slave)   # bytes as they are: no echo, no line editing, no CR/LF translation
    name = os.ttyname(slave)
    announced = False
    err = b""
    fds = [node.stdout.fileno(), node.stderr.fileno(), master]
    while True:
        ready, _, _ = select.select(fds, [], [], 1.0)
        if node.poll() is not None and not ready:
            sys.stderr.write("rp2040js ended (exit status %s)\n" % node.returncode)
            return 1
        for fd in ready:
            data = os.read(fd, 4096)
            if fd == node.stdout.fileno():
                if data:
                    os.write(master, data)
            elif fd == node.stderr.fileno():
                err += data
                if not announced and b"USB CDC connected" in err:
                    announced = True
                    print("char device redirected to %s" % name, flush=True)
                if data:
                    sys.stderr.buffer.write(data)
                    sys.stderr.flush()
                elif node.poll() is not None:
                    return 1
            elif fd == master:
                if data:
                    node.stdin.write(data)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
