"""Serve the REPL of a Pico firmware running in rp2040js (run.mjs) on a pseudo-terminal,
the way `qemu-system-arm -serial pty` does, so that MicroPython's run-tests.py drives it:

    run-tests.py -t execpty:"python3 pty_bridge.py FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]"

(MORE.uf2: further images for the flash, such as a ROMFS image; run.mjs says how.)

Prints one line, "char device redirected to /dev/pts/N", once the device's USB CDC is
connected (run-tests.py reads the pty's name from it), then copies bytes both ways until
the node process ends or this process is killed. Nothing else goes to stdout: run-tests.py
never reads it again. node's diagnostics go to stderr.

Nothing outlives the process that started the bridge: the bridge asks the kernel for SIGKILL
when its parent dies, and node for SIGKILL when the bridge dies (Linux's PR_SET_PDEATHSIG), so
a test run killed halfway, even by SIGKILL, leaves neither behind.
"""
import ctypes
import os
import select
import signal
import subprocess
import sys
import tty

HERE = os.path.dirname(os.path.abspath(__file__))
PR_SET_PDEATHSIG = 1


def die_with_parent():
    """SIGKILL this process when its parent dies (and now, if the parent is already gone)."""
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return   # not Linux: the caller's process group is all there is
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
    if len(argv) < 2:
        sys.exit("usage: pty_bridge.py FIRMWARE.uf2 BOOTROM.ts [MORE.uf2 ...]")
    die_with_parent()
    argv = [os.path.abspath(a) for a in argv]   # node runs in this directory (its node_modules)
    node = subprocess.Popen(["node", os.path.join(HERE, "run.mjs")] + argv, cwd=HERE, preexec_fn=die_with_parent,
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
