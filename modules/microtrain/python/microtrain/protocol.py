# The microtrain serial protocol: one definition, run unchanged by the board
# (MicroPython, in serve.py) and by the host (CPython, microtrain.device.link).
#
# A frame:
#     a5 5a | kind u8 | flags u8 | seq u16 | length u16 | hcrc u32 | payload | crc u32
# little-endian; hcrc is the CRC-32 (zlib's) of kind..length, crc that of kind..length
# and the payload. The header has its own check so that a damaged length is never
# waited for: the reader drops the frame at once. The host sends a
# command, the board answers with the same seq and kind | REPLY (or ERROR). The
# host alone keeps timers: it resends a command (same seq) when no answer comes,
# and the board, which remembers its last answer, sends that again instead of
# running a command twice. A frame that fails its CRC, or stops short (bytes
# dropped: the line goes quiet before its end), is dropped; the board then sends
# NAK, so the host resends at once. The host's timers come from the round trips it
# measures (docs/serial.md). Commands that take longer than a round trip (training,
# saving) ask for an ACK first (flag ACK), so a lost command is resent after a round
# trip, not after the command's full time.
#
# Samples travel in the plan's input type (float32, or int8/uint8 for a plan that takes
# integer input), then their labels (int32) or targets (float32), the inputs' block padded
# to 4 bytes. A sample too big for one frame with its command is staged first: STAGE frames
# carry it (input, padding, label or target) into one buffer on the board (allocated once,
# with the plan), and TRAIN, EVALUATE or PREDICT with the flag STAGED then name it by its tag.
import struct

try:
    from binascii import crc32
except ImportError:  # a MicroPython build without binascii.crc32
    from zlib import crc32

VERSION = 2             # 2: samples in the plan's input type; STAGE

SYNC = b"\xa5\x5a"
HEADER = "<2sBBHHI"     # sync, kind, flags, seq, length, header CRC
HEADER_LEN = 12
CRC_LEN = 4
OVERHEAD = HEADER_LEN + CRC_LEN
MAX_PAYLOAD = 4096

# kinds
ACK = 0x06
NAK = 0x15
ERROR = 0x21            # '!': the command failed; payload is JSON {"error", "message"}
REPLY = 0x80            # kind | REPLY answers kind

HELLO = 0x48            # 'H' JSON {version, nonce} -> JSON board facts; starts a session
INFO = 0x49             # 'I' -> JSON trainer info, heap, run
PLAN_BEGIN = 0x42       # 'B' JSON {bytes, crc} -> JSON {}
PLAN_DATA = 0x44        # 'D' PLAN_DATA_HEAD + bytes -> u32 bytes received
PLAN_END = 0x45         # 'E' -> JSON trainer info (the plan is verified, stored, loaded)
PLAN_READ = 0x46        # 'F' PLAN_READ_HEAD -> bytes of the board's plan
RUN = 0x52              # 'R' JSON {run, resume} -> JSON {run, samples}
TRAIN = 0x54            # 'T' TRAIN_HEAD + x + y -> TRAIN_REPLY
PREDICT = 0x50          # 'P' PREDICT_HEAD + x -> outputs (float32)
EVALUATE = 0x56         # 'V' PREDICT_HEAD + x + y -> EVAL_REPLY
SAVE = 0x53             # 'S' -> JSON {samples, bytes}: checkpoint now
RESTORE = 0x4C          # 'L' -> JSON {run, samples}: back to the last checkpoint
PARAMS = 0x4D           # 'M' -> JSON [[name, bytes, typecode], ...]
PARAM_READ = 0x47       # 'G' PARAM_READ_HEAD -> bytes
QUIT = 0x51             # 'Q' -> JSON {}; the server returns to the REPL
FETCH = 0x58            # 'X' FETCH_HEAD -> bytes of the last long answer
# federated rounds (`microtrain fleet`, docs/fleet.md): the board trains on its own stored
# samples (samples.py); only the plan's trainable values cross the link
FED_BEGIN = 0x4F        # 'O' JSON {run, seed, epochs, steps, train, params, crc} -> JSON {run, samples, have, stored, total}
FED_WRITE = 0x57        # 'W' FED_WRITE_HEAD + bytes of the round's values -> u32 bytes received
FED_APPLY = 0x41        # 'A' -> JSON {run, samples}: the values set, the optimizer cleared, checkpointed
LOCAL_TRAIN = 0x4A      # 'J' TRAIN_HEAD (no samples follow) -> TRAIN_REPLY: trains stored samples
LOCAL_EVAL = 0x55       # 'U' LOCAL_EVAL_HEAD -> EVAL_REPLY over the stored samples start..start+count-1
FED_PARAMS = 0x4E       # 'N' -> JSON [[name, bytes], ...]: the values in the round's encodings, for PARAM_READ
STAGE = 0x59            # 'Y' STAGE_HEAD + bytes of one sample (input, padding, label) -> u32 bytes of it staged

# flags
FLAG_ACK = 0x01         # the board sends ACK as soon as the frame checks out
FLAG_MORE = 0x02        # in an answer: payload is u32 length + the answer's start; FETCH the rest
LIMIT_SHIFT = 4         # in a command: flags >> 4 = k > 0 limits answers to 32 << k bytes
                        # (a noisy line gets shorter frames; the host lowers k on resends)

TRAIN_ACCURACY = 0x01   # TRAIN flag: predict each sample before training on it
TRAIN_DRY = 0x02        # TRAIN flag: receive and check, but do not train (link benchmark)
STAGED = 0x04           # TRAIN, EVALUATE, PREDICT flag: one sample, the staged one; STAGED_HEAD
                        # (its tag) follows the command's head, and nothing else

# binary payloads (the rest of the payload follows the head)
TRAIN_HEAD = "<IHH"     # first sample's index in the run, count, TRAIN_* flags
TRAIN_REPLY = "<IHHfI"  # samples trained in the run so far, trained now, correct, loss sum, heap free
PREDICT_HEAD = "<HH"    # count, flags (STAGED)
EVAL_REPLY = "<HHf"     # count, correct (cross-entropy), sum of squared errors (mse)
PLAN_DATA_HEAD = "<I"   # offset
PARAM_READ_HEAD = "<HIH"  # parameter index, byte offset, byte count
PLAN_READ_HEAD = "<IH"  # byte offset, byte count
FETCH_HEAD = "<IH"      # byte offset, byte count
FED_WRITE_HEAD = "<I"   # byte offset into the round's values (all parameters, in FED_BEGIN's order)
LOCAL_EVAL_HEAD = "<IH"  # first stored sample, count
STAGE_HEAD = "<II"      # the sample's tag (new tag: a new sample, from offset 0), byte offset
STAGED_HEAD = "<I"      # the staged sample's tag


def reply_limit(flags):
    """The most payload bytes an answer to a command with these flags may carry."""
    k = flags >> LIMIT_SHIFT
    return 32 << k if k else MAX_PAYLOAD

NAMES = {ACK: "ACK", NAK: "NAK", ERROR: "ERROR", HELLO: "HELLO", INFO: "INFO",
         PLAN_BEGIN: "PLAN_BEGIN", PLAN_DATA: "PLAN_DATA", PLAN_END: "PLAN_END", PLAN_READ: "PLAN_READ", RUN: "RUN",
         TRAIN: "TRAIN", PREDICT: "PREDICT", EVALUATE: "EVALUATE", SAVE: "SAVE",
         RESTORE: "RESTORE", PARAMS: "PARAMS", PARAM_READ: "PARAM_READ", QUIT: "QUIT", FETCH: "FETCH",
         FED_BEGIN: "FED_BEGIN", FED_WRITE: "FED_WRITE", FED_APPLY: "FED_APPLY", LOCAL_TRAIN: "LOCAL_TRAIN",
         LOCAL_EVAL: "LOCAL_EVAL", FED_PARAMS: "FED_PARAMS", STAGE: "STAGE"}


def x_bytes(count, nx):
    """Bytes of count inputs of nx bytes each on the line: padded to 4, so labels and
    targets after them stay aligned."""
    return (count * nx + 3) & ~3


def frame_crc(head, payload):
    """CRC-32 of a frame: head is its header, payload its payload."""
    return crc32(payload, crc32(memoryview(head)[2:8])) & 0xFFFFFFFF


def parse_header(head):
    """(kind, flags, seq, length) of a header, or None if it cannot start a frame."""
    sync, kind, flags, seq, length, hcrc = struct.unpack_from(HEADER, head, 0)
    if sync != SYNC or length > MAX_PAYLOAD or hcrc != crc32(memoryview(head)[2:8]) & 0xFFFFFFFF:
        return None
    return kind, flags, seq, length


def encode(kind, seq, payload=b"", flags=0):
    """One whole frame as bytes."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("payload of %d bytes exceeds the frame limit of %d" % (len(payload), MAX_PAYLOAD))
    fields = struct.pack("<BBHH", kind, flags, seq & 0xFFFF, len(payload))
    head = SYNC + fields + struct.pack("<I", crc32(fields) & 0xFFFFFFFF)
    return head + bytes(payload) + struct.pack("<I", frame_crc(head, payload))
