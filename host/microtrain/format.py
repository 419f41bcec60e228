"""The .mtp plan format: the one definition both sides use.

Python writes and reads plans with these tables; `python host/microtrain/format.py`
prints modules/microtrain/mt_format.h from them, and a test checks that the
committed header is exactly that output, so host and device cannot drift.
docs/plan-format.md describes the same layout in prose.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"MTPL"
VERSION = 4         # 2: int8 tensors, quantization table, input dtype, int8 ops; 3: the context section;
                    # 4: the stream section and its group table (constants read from a file in execution order)
ALIGN = 8           # every section, constant, state and arena offset is a multiple of this
NO_TENSOR = 0xFFFF  # an absent optional tensor slot
NO_NAME = 0xFFFFFFFF
MAX_SLOTS = 24      # tensor slots per op (PWDW_W8_BWD has 20)
MAX_ATTRS = 24      # int32 attributes per op (CONV_DW_PW_Q8 has 23)
MAX_DIMS = 4

# ---- header: (field, struct code); little-endian, packed in this order ----
HEADER_FIELDS = [
    ("magic", "4s"),          # b"MTPL"
    ("version", "H"),         # format version, VERSION
    ("header_bytes", "H"),    # size of this header
    ("file_bytes", "I"),      # size of the whole plan
    ("crc32", "I"),           # CRC-32 (IEEE 802.3) of bytes [16, file_bytes)
    ("flags", "I"),           # reserved, 0
    ("n_tensors", "H"),
    ("n_ops", "H"),
    ("tensors_off", "I"),     # tensor table: n_tensors records of TENSOR_FIELDS
    ("ops_off", "I"),         # op list in execution order
    ("ops_bytes", "I"),
    ("data_off", "I"),        # constants and initial parameter values
    ("data_bytes", "I"),
    ("names_off", "I"),       # NUL-terminated tensor names
    ("names_bytes", "I"),
    ("meta_off", "I"),        # UTF-8 JSON for host tools; the device ignores it
    ("meta_bytes", "I"),
    ("arena_bytes", "I"),     # planned size of the transient region
    ("state_bytes", "I"),     # persistent region: trainable parameters, optimizer state
    ("naive_bytes", "I"),     # transient tensors if none shared memory (informational)
    ("const_bytes", "I"),     # frozen constants (informational)
    ("macs_lo", "I"),         # multiply-accumulates of one training step (informational)
    ("macs_hi", "I"),
    ("input_tensor", "H"),
    ("target_tensor", "H"),
    ("output_tensor", "H"),
    ("loss", "B"),            # LOSS_*
    ("reserved0", "B"),
    ("batch", "H"),           # samples per update, >= 1
    ("reserved1", "H"),
    ("lr", "f"),
    ("momentum", "f"),
    ("weight_decay", "f"),
    ("quant_off", "I"),       # quantization table: n_quant records of QUANT_FIELDS (0 if none)
    ("n_quant", "H"),
    ("input_dtype", "B"),     # what the caller passes: DTYPE F32 (float input), I8, or U8 (flipped to I8)
    ("reserved3", "B"),
    ("context_off", "I"),     # the runtime context prepared on the host (plan.py), 0 for none: used in
    ("context_bytes", "I"),   #   place (RAM saved) where it is what the core prepares, else decoded into RAM
    # the stream section (docs/plan-format.md, Streaming): constants a board may read from the plan's file, a
    # group at a time, into a window in the arena just before the ops that read them; 0, 0, 0, 0, 0 for none.
    # The plan's head, [0, stream_off), holds every other section the device reads.
    ("stream_off", "I"),
    ("stream_bytes", "I"),
    ("stream_crc32", "I"),    # CRC-32 of bytes [stream_off, file_bytes): the file's crc32 follows from the head's
    ("groups_off", "I"),      # group table: n_groups records of GROUP_FIELDS, in the head
    ("n_groups", "H"),
    ("reserved2", "H"),       # zero
]
HEADER_STRUCT = struct.Struct("<" + "".join(code for _, code in HEADER_FIELDS))
HEADER_BYTES = HEADER_STRUCT.size
CRC_START = 16

TENSOR_FIELDS = [
    ("dtype", "B"),           # DTYPE_*
    ("storage", "B"),         # STORAGE_*
    ("ndim", "B"),            # 1..MAX_DIMS
    ("flags", "B"),           # TFLAG_*
    ("offset", "I"),          # into the arena, the state region or the data section
    ("bytes", "I"),           # elements * dtype size
    ("dim0", "I"),
    ("dim1", "I"),
    ("dim2", "I"),
    ("dim3", "I"),            # unused dims are 1
    ("name", "I"),            # offset into the names section, or NO_NAME
    ("init", "I"),            # trainable parameter: offset of its initial value in data; else NO_NAME
    ("quant", "H"),           # index into the quantization table, NO_QUANT for none
    ("reserved", "H"),
]
TENSOR_STRUCT = struct.Struct("<" + "".join(code for _, code in TENSOR_FIELDS))
TENSOR_BYTES = TENSOR_STRUCT.size

# quantization parameters of an int8 (or int32 bias) tensor: real = scale * (q - zero_point),
# per tensor, or per channel along `axis` with the scales (and zero points) in the data section
NO_QUANT = 0xFFFF
PER_TENSOR = 0xFF    # axis of a per-tensor record
QUANT_FIELDS = [
    ("scale", "f"),           # per tensor: the scale (finite, > 0); per channel: 0
    ("zero_point", "i"),      # per tensor: the zero point, in the dtype's range (0 for I32); per channel: 0
    ("axis", "B"),            # PER_TENSOR, or the channel axis (< ndim)
    ("where", "B"),           # per channel: QUANT_IN_DATA, the scales and zero points in the data section, or
                              #   QUANT_IN_STREAM, in the stream section (read with the group of the op using them)
    ("reserved", "2s"),       # zero
    ("n_channels", "I"),      # per channel: dim[axis]; per tensor: 1
    ("scales", "I"),          # per channel: data offset of n_channels f32 scales (finite, > 0); else NO_NAME
    ("zero_points", "I"),     # per channel: data offset of n_channels i32 zero points, NO_NAME for all 0
]
QUANT_STRUCT = struct.Struct("<" + "".join(code for _, code in QUANT_FIELDS))
QUANT_BYTES = QUANT_STRUCT.size
QUANT_IN_DATA = 0
QUANT_IN_STREAM = 1

# A group of the stream section: bytes [lo, lo + bytes) of it, which ops first_op..last_op read (every STREAM
# tensor they read and the stream-held scales of their tensors lie inside), read into the arena at `window`
# before first_op and kept there through last_op; its CRC is checked as it is read. Sorted by first_op, the op
# ranges disjoint. RESET_GROUP as first_op and last_op: the trainable parameters' initial values (their
# `init` offsets then point into the stream section), read into the state region on reset; at most one, last.
RESET_GROUP = 0xFFFF
GROUP_FIELDS = [
    ("first_op", "H"),
    ("last_op", "H"),
    ("window", "I"),          # arena offset, a multiple of 8 (0 for the reset group)
    ("lo", "I"),              # offset in the stream section, a multiple of 8
    ("bytes", "I"),           # >= 1
    ("crc32", "I"),           # CRC-32 of the group's bytes
]
GROUP_STRUCT = struct.Struct("<" + "".join(code for _, code in GROUP_FIELDS))
GROUP_BYTES = GROUP_STRUCT.size

# op record: u8 code, u8 phase, u8 n_tensors, u8 n_attrs, u16 tensor[n_tensors],
# padding to 4 bytes, i32 attr[n_attrs]
OP_HEAD_STRUCT = struct.Struct("<BBBB")
OP_HEAD_BYTES = OP_HEAD_STRUCT.size

# A training-state blob (mt_save_state / mt_load_state): this header, the whole
# state region (parameters, momentum, gradient accumulators), then the CRC-32 of
# everything before it. Resuming from it continues bit for bit.
STATE_MAGIC = b"MTST"
STATE_VERSION = 1
STATE_FIELDS = [
    ("magic", "4s"),          # b"MTST"
    ("version", "H"),         # STATE_VERSION
    ("reserved0", "H"),       # 0
    ("plan_crc32", "I"),      # the crc32 field of the plan it was saved with
    ("state_bytes", "I"),     # size of the state region that follows the header
    ("steps", "I"),           # samples trained
    ("updates", "I"),         # parameter updates applied
    ("in_batch", "I"),        # samples since the last update, < batch
    ("rejected", "I"),        # steps refused for a non-finite loss or gradient norm
    ("lr", "f"),              # learning rate (it may differ from the plan's)
    ("reserved1", "I"),       # 0
]
STATE_STRUCT = struct.Struct("<" + "".join(code for _, code in STATE_FIELDS))
STATE_HEADER_BYTES = STATE_STRUCT.size

DTYPES = {"F32": (1, 4), "I32": (2, 4), "I8": (3, 1), "U8": (4, 1)}  # name: (code, size)
# INPUT: the caller's sample, read in place; STREAM: a constant in the stream section, read through its group
STORAGES = {"ARENA": 0, "CONST": 1, "STATE": 2, "INPUT": 3, "STREAM": 4}
TFLAGS = {"PARAM": 1, "MOMENTUM": 2, "GRAD_ACC": 4, "INPUT": 8, "TARGET": 16, "OUTPUT": 32}
PHASES = {"FORWARD": 0, "TRAIN": 1, "BATCH_END": 2}
LOSSES = {"CROSS_ENTROPY": 1, "MSE": 2}


@dataclass(frozen=True)
class Slot:
    name: str
    role: str          # "in" (read), "out" (written, arena), "param" (trainable, state), "state" (state)
    dtype: str = "F32"
    optional: bool = False


@dataclass(frozen=True)
class OpSpec:
    name: str
    code: int
    slots: tuple
    attrs: tuple
    inplace: tuple = ()     # (out slot, in slot) pairs allowed to share memory exactly
    blocks: bool = False    # it may consume its stream constants in blocks of output channels, run once per
                            # block (stream.py, mt_stream.c)

    def slot_index(self, name):
        return [s.name for s in self.slots].index(name)


def _s(spec):
    """'x y:out b? w:param' -> Slots; '?' marks an optional slot, ':I32' a dtype."""
    out = []
    for word in spec.split():
        optional = word.endswith("?")
        word = word.rstrip("?")
        name, _, rest = word.partition(":")
        role, dtype = "in", "F32"
        for part in filter(None, rest.split(":")):
            if part in DTYPES:
                dtype = part
            else:
                role = part
        out.append(Slot(name, role, dtype, optional))
    return tuple(out)


CONV_ATTRS = ("stride_h", "stride_w", "pad_t", "pad_l", "pad_b", "pad_r",
              "dil_h", "dil_w", "groups")
POOL_ATTRS = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_t", "pad_l",
              "pad_b", "pad_r", "dil_h", "dil_w", "count_include_pad")
# the range of weight elements a gradient op trains: output channels [o_begin, o_begin+o_count)
# and input channels (within a group) [i_begin, i_begin+i_count)
RANGE_ATTRS = ("o_begin", "o_count", "i_begin", "i_count")
# the depthwise stage of a streamed op: CONV_ATTRS but groups (the channel count)
DW_ATTRS = ("dw_stride_h", "dw_stride_w", "dw_pad_t", "dw_pad_l", "dw_pad_b", "dw_pad_r", "dw_dil_h", "dw_dil_w")
Q8_CLAMP = ("act_min", "act_max")     # int8 output clamp, -128 <= act_min <= act_max <= 127
SINK = "w:param m:state? acc:state?"
ACT_ATTRS = ("kind", "alpha_bits", "beta_bits")
ACT_KINDS = {"SIGMOID": 0, "TANH": 1, "HARDSIGMOID": 2, "HARDSWISH": 3, "LEAKYRELU": 4}
ACT_READS_Y = ("SIGMOID", "TANH")      # kinds whose backward reads the output (the others read x)   # optimizer sink shared by all parameter-gradient ops

OPS = (
    OpSpec("CONV2D", 1, _s("x w b? y:out"), CONV_ATTRS),
    OpSpec("CONV2D_BWD_INPUT", 2, _s("dy w dx:out"), CONV_ATTRS),
    OpSpec("CONV2D_BWD_WEIGHT", 3, _s("dy x " + SINK), CONV_ATTRS + RANGE_ATTRS),
    OpSpec("GEMM", 4, _s("x w b? y:out"), ("w_layout",)),
    OpSpec("GEMM_BWD_INPUT", 5, _s("dy w dx:out"), ("w_layout",)),
    OpSpec("GEMM_BWD_WEIGHT", 6, _s("dy x " + SINK), ("w_layout",) + RANGE_ATTRS),
    OpSpec("BIAS_BWD", 7, _s("dy " + SINK), ("o_begin", "o_count")),
    OpSpec("CLIP", 8, _s("x y:out"), ("lo_bits", "hi_bits"), inplace=(("y", "x"),)),
    OpSpec("CLIP_BWD", 9, _s("y dy dx:out"), ("lo_bits", "hi_bits"), inplace=(("dx", "dy"),)),
    OpSpec("MAXPOOL", 10, _s("x y:out"), POOL_ATTRS),
    OpSpec("MAXPOOL_BWD", 11, _s("x dy dx:out"), POOL_ATTRS),
    OpSpec("AVGPOOL", 12, _s("x y:out"), POOL_ATTRS),
    OpSpec("AVGPOOL_BWD", 13, _s("dy dx:out"), POOL_ATTRS),
    OpSpec("GAP", 14, _s("x y:out"), ()),
    OpSpec("GAP_BWD", 15, _s("dy dx:out"), ()),
    OpSpec("ADD", 16, _s("a b y:out"), (), inplace=(("y", "a"), ("y", "b"))),
    OpSpec("SOFTMAX_CE", 17, _s("logits label:I32 dlogits:out"), ()),
    OpSpec("MSE", 18, _s("out target dout:out"), ()),
    OpSpec("SGD", 19, _s("w:param m:state? acc:state"), ()),
    # ---- int8 (docs/quantization.md). Activations are int8 with a per-tensor scale and zero
    # point (their tensors' quantization records); weights int8, symmetric, per output channel;
    # biases int32 at scale x_scale * w_scale. Requantization is integer-only: each output
    # channel's real multiplier x_scale * w_scale / y_scale as a Q31 `mult` and a power-of-two
    # `shift` (TFLite's rounding); act_min/act_max clamp the int8 output (ReLU, ReLU6 folded).
    OpSpec("QUANTIZE", 20, _s("x y:out:I8"), ()),
    OpSpec("DEQUANTIZE", 21, _s("x:I8 y:out"), ()),
    # DEQUANTIZE then ADD without the float copy: y = a + (q - zero_point) * scale, y over a (a
    # residual from the int8 prefix added to a float block's output; dq_conv.py)
    OpSpec("ADD_DQ", 80, _s("a q:I8 y:out"), (), inplace=(("y", "a"),)),
    OpSpec("CONV2D_Q8", 22, _s("x:I8 w:I8 b:I32? mult:I32 shift:I32 y:out:I8"), CONV_ATTRS + Q8_CLAMP),
    OpSpec("GEMM_Q8", 23, _s("x:I8 w:I8 b:I32? mult:I32 shift:I32 y:out:I8"), ("w_layout",) + Q8_CLAMP),
    OpSpec("ADD_Q8", 24, _s("a:I8 b:I8 y:out:I8"),
           ("left_shift", "a_mult", "a_shift", "b_mult", "b_shift", "y_mult", "y_shift") + Q8_CLAMP,
           inplace=(("y", "a"), ("y", "b"))),
    OpSpec("MAXPOOL_Q8", 25, _s("x:I8 y:out:I8"), POOL_ATTRS),
    # mult/shift of AVGPOOL_Q8: one per window size n = 1 .. kernel_h*kernel_w (x_scale / (y_scale * n))
    OpSpec("AVGPOOL_Q8", 26, _s("x:I8 mult:I32 shift:I32 y:out:I8"), POOL_ATTRS),
    OpSpec("GAP_Q8", 27, _s("x:I8 y:out:I8"), ("mult", "shift")),
    # backward through frozen int8 layers, in float: the gradient passes where the saved int8
    # output lies strictly inside (act_min, act_max) (ReLU, ReLU6, saturation), and the input
    # gradient of a convolution or Gemm reads the int8 weight with its per-channel scales; max
    # pooling sends each output's gradient to its window's first maximum of the int8 input
    OpSpec("CLIP_BWD_Q8", 28, _s("y:I8 dy dx:out"), Q8_CLAMP, inplace=(("dx", "dy"),)),
    OpSpec("CONV2D_BWD_INPUT_Q8", 29, _s("dy w:I8 dx:out"), CONV_ATTRS),
    OpSpec("GEMM_BWD_INPUT_Q8", 30, _s("dy w:I8 dx:out"), ("w_layout",)),
    OpSpec("MAXPOOL_BWD_Q8", 31, _s("x:I8 dy dx:out"), POOL_ATTRS),
    # a 1x1 CONV2D_Q8 (w1..s1, clamp act_min1/act_max1) streamed into a depthwise CONV2D_Q8 (w2..s2,
    # the CONV attributes, groups = channels; clamp act_min/act_max) row by row: the expanded
    # tensor exists only as `ring`, the last (KH-1)*dil_h+1 of its rows (ring: rows x E x W, int8,
    # the expanded tensor's quantization); the same integers as the two ops (docs/quantization.md)
    OpSpec("PWDW_Q8", 32, _s("x:I8 w1:I8 b1:I32? mult1:I32 shift1:I32 w:I8 b:I32? mult:I32 shift:I32 "
                             "ring:out:I8 y:out:I8"), CONV_ATTRS + Q8_CLAMP + ("act_min1", "act_max1")),
    # PWDW_Q8 streamed into the float 1x1 conv that reads its output (the first float layer after
    # an int8 prefix, CONV2D_DQ_W8 or CONV2D_DQ: w2 (O, E, 1, 1), int8 with per-output-channel
    # scales or float32; b2): each depthwise output row goes to `row` (E x OW, y's quantization),
    # is dequantized K channels at a time into xs (K x OW floats, 1 <= K <= E, as DEQUANTIZE), its
    # O output rows summed on into yrow (O x OW floats) and copied to y's row. Neither the depthwise output nor its float copy exists
    # whole; y is the three ops' bit for bit (dq_conv.py, mt_pwdw_q8.c)
    OpSpec("PWDW_DQ_W8", 78, _s("x:I8 w1:I8 b1:I32? mult1:I32 shift1:I32 w:I8 b:I32? mult:I32 shift:I32 "
                                "ring:out:I8 row:out:I8 w2:I8 b2? xs:out yrow:out y:out"),
           CONV_ATTRS + Q8_CLAMP + ("act_min1", "act_max1")),
    OpSpec("PWDW_DQ", 79, _s("x:I8 w1:I8 b1:I32? mult1:I32 shift1:I32 w:I8 b:I32? mult:I32 shift:I32 "
                             "ring:out:I8 row:out:I8 w2 b2? xs:out yrow:out y:out"),
           CONV_ATTRS + Q8_CLAMP + ("act_min1", "act_max1")),
    # gradient-norm clipping (compile(clip_grad=...)): every gradient goes to an accumulator;
    # at the end of the batch GRAD_NORM2 sums the squares of all of them into n2 (first=1
    # starts the sum), then GRAD_CLIP scales each by min(1, max_norm / (|mean gradient| + 1e-6))
    # as torch.nn.utils.clip_grad_norm_ does, before the SGD ops; a non-finite norm clears
    # every accumulator and the last GRAD_CLIP (last=1) rejects the update
    OpSpec("GRAD_NORM2", 40, _s("acc:state n2:out"), ("first",)),
    OpSpec("GRAD_CLIP", 41, _s("n2 acc:state"), ("max_norm_bits", "last")),
    # element-wise activations, one code with a kind (ACT_KINDS); alpha and beta are f32 bits
    # (HardSigmoid, HardSwish: max(0, min(1, alpha x + beta)); LeakyRelu: the negative slope).
    # ACT_BWD reads v, the saved output y for SIGMOID and TANH, the input x for the others
    OpSpec("ACT", 42, _s("x y:out"), ACT_ATTRS, inplace=(("y", "x"),)),
    OpSpec("ACT_BWD", 43, _s("v dy dx:out"), ACT_ATTRS, inplace=(("dx", "dy"),)),
    # y = a * b, b of a's size or one value per channel (a (1,C,H,W), b (1,C,1,1): squeeze-and-
    # excitation); the gradient of a is MUL(dy, b), of a per-channel b MUL_BWD_CHANNEL(dy, a)
    OpSpec("MUL", 44, _s("a b y:out"), (), inplace=(("y", "a"), ("y", "b"))),
    OpSpec("MUL_BWD_CHANNEL", 45, _s("dy a db:out"), ()),
    # y = x * s[c] + t[c] per channel c (dim 1): a frozen BatchNormalization, or Mul, Add, Sub,
    # Div by a constant; its input gradient is MUL(dy, s)
    OpSpec("AFFINE", 46, _s("x s t y:out"), (), inplace=(("y", "x"),)),
    # channel concatenation of two to four (1,C,...) tensors is one after the other in memory;
    # the gradient of each input is a SLICE of dy, elements [begin, begin + n)
    OpSpec("CONCAT", 47, _s("a b c? d? y:out"), ()),
    OpSpec("SLICE", 48, _s("x y:out"), ("begin",)),
    # 1-bit masks for the backward of Clip (ReLU, ReLU6) when only the mask is needed
    # (compile(saved="bits")): MASK_PACK packs bit i = lo < y[i] < hi of the float output into
    # m, a U8 tensor of ceil(n / 8) bytes (bit i is bit i % 8 of byte i / 8); MASK_BWD is then
    # CLIP_BWD on the bits: dx = dy where the bit is set, else 0
    OpSpec("MASK_PACK", 49, _s("y m:out:U8"), ("lo_bits", "hi_bits")),
    OpSpec("MASK_BWD", 50, _s("m:U8 dy dx:out"), (), inplace=(("dx", "dy"),)),
    # a weight trained on some input channels: the trained convolution reads the GATHER_CH of
    # those channels (idx: their numbers, constant int32); its input gradient goes back through
    # SCATTER_CH (zeros in the other channels). docs/sparse.md
    OpSpec("GATHER_CH", 56, _s("x idx:I32 y:out"), ()),
    OpSpec("SCATTER_CH", 57, _s("dy idx:I32 dx:out"), ()),
    # a depthwise CONV2D (groups = channels) that may write y over x, which nothing reads after
    # it: each input channel is copied to s (one plane) before its output channel is written
    OpSpec("CONV2D_DW_INPLACE", 58, _s("x w b? s:out y:out"), CONV_ATTRS, inplace=(("y", "x"),)),
    # its input gradient the same way: dx over dy, each dy channel copied to s first
    OpSpec("CONV2D_BWD_INPUT_DW_INPLACE", 59, _s("dy w s:out dx:out"), CONV_ATTRS, inplace=(("dx", "dy"),)),
    # y = acc + conv(x, w) (no bias): the trained input channels of a split weight (split.py)
    # added to the frozen part's output, in its memory
    OpSpec("CONV2D_ACC", 60, _s("x w acc y:out"), CONV_ATTRS, inplace=(("y", "acc"),)),
    # y = acc with t's K channels added into channels idx of it (y[idx[k]] += t[k]), in acc's
    # memory: a depthwise weight trained on channels idx (split.py) adds its trained convolution
    # to the frozen one's output, and a gathered input's gradient joins the frozen one's
    OpSpec("SCATTER_ACC_CH", 71, _s("t idx:I32 acc y:out"), (), inplace=(("y", "acc"),)),
    # an int8 conv (w0..shift0, the CONV attributes, groups 1; clamp act_min0/act_max0) streamed
    # into a depthwise conv (w1..shift1, the dw_ attributes, groups = channels; act_min1/act_max1)
    # streamed into a 1x1 conv (w..shift; act_min/act_max), row by row: the first conv's output
    # exists only as `ring`, its last (KH-1)*dw_dil_h+1 rows (rows x E x W, its quantization), the
    # depthwise output as `row`, one row (E x OW, its quantization); the same integers as the
    # three ops (docs/quantization.md). A stem and its first block, or an expansion block
    # without its input, never hold their large tensors. A ring of one channel (rows x 1 x W)
    # runs the depthwise row a channel at a time, first-conv rows made again (ring_channels.py).
    OpSpec("CONV_DW_PW_Q8", 72, _s("x:I8 w0:I8 b0:I32? mult0:I32 shift0:I32 w1:I8 b1:I32? mult1:I32 shift1:I32 "
                                   "w:I8 b:I32? mult:I32 shift:I32 ring:out:I8 row:out:I8 y:out:I8"),
           CONV_ATTRS + DW_ATTRS + ("act_min0", "act_max0", "act_min1", "act_max1") + Q8_CLAMP),
    # two CONV_DW_PW_Q8 in a row, the second reading the first's output alone, as a pipe: the
    # first's output y exists only as `pipe`, its last rows (rows x O x OW, y's quantization; out_h
    # the rows of y), as many as one window of the second's first conv spans ((KH-1)*dil_h+1; with
    # the second's ring one channel, the rows R of its first conv's rows span); the
    # first op does nothing when it runs, the second (its x the pipe, in_h = out_h) runs the first
    # a row at a time as its first conv needs the rows: the stem's output, the largest int8
    # tensor of an MCU network, is never stored (the integers of the two ops; docs/quantization.md)
    OpSpec("CONV_DW_PW_Q8_TO_PIPE", 70, _s("x:I8 w0:I8 b0:I32? mult0:I32 shift0:I32 w1:I8 b1:I32? mult1:I32 "
                                           "shift1:I32 w:I8 b:I32? mult:I32 shift:I32 ring:out:I8 row:out:I8 "
                                           "y:out:I8"),
           CONV_ATTRS + DW_ATTRS + ("act_min0", "act_max0", "act_min1", "act_max1") + Q8_CLAMP + ("out_h",)),
    OpSpec("CONV_DW_PW_Q8_FROM_PIPE", 75, _s("x:I8 w0:I8 b0:I32? mult0:I32 shift0:I32 w1:I8 b1:I32? mult1:I32 "
                                             "shift1:I32 w:I8 b:I32? mult:I32 shift:I32 ring:out:I8 row:out:I8 "
                                             "y:out:I8"),
           CONV_ATTRS + DW_ATTRS + ("act_min0", "act_max0", "act_min1", "act_max1") + Q8_CLAMP + ("in_h",)),
    # float activations with a frozen int8 weight (compile(frozen_weights="int8"), w8.py): the
    # weight's quantization record gives one scale per output channel (axis 0, zero points 0), and
    # each runs as the float op above on W' = float32(q) * scale[o], bit for bit. Filters of at most
    # 64 taps (mt_conv.c, MT_W8_BUF)
    OpSpec("CONV2D_W8", 61, _s("x w:I8 b? y:out"), CONV_ATTRS),
    OpSpec("CONV2D_DW_INPLACE_W8", 62, _s("x w:I8 b? s:out y:out"), CONV_ATTRS, inplace=(("y", "x"),)),
    OpSpec("CONV2D_BWD_INPUT_W8", 63, _s("dy w:I8 dx:out"), CONV_ATTRS),
    OpSpec("CONV2D_BWD_INPUT_DW_INPLACE_W8", 64, _s("dy w:I8 s:out dx:out"), CONV_ATTRS, inplace=(("dx", "dy"),)),
    # DEQUANTIZE then CONV2D_W8 (groups 1) without the float input whole (dq_conv.py): x's channels
    # dequantized K at a time into xs (K planes, as DEQUANTIZE), each output summed on from where the
    # last K stopped: y is CONV2D_W8's bit for bit, whatever K
    OpSpec("CONV2D_DQ_W8", 76, _s("x:I8 w:I8 b? y:out xs:out"), CONV_ATTRS),
    # the same with a float32 frozen weight (compile's default frozen_weights): DEQUANTIZE then CONV2D
    OpSpec("CONV2D_DQ", 77, _s("x:I8 w b? y:out xs:out"), CONV_ATTRS),
    # the trained input channels of a split weight held int8 (compile(trained_weights="int8")): y = acc +
    # conv(x, W'), CONV2D_ACC on the dequantized weight, bit for bit
    OpSpec("CONV2D_ACC_W8", 66, _s("x w:I8 acc y:out"), CONV_ATTRS, inplace=(("y", "acc"),)),
    # a trained weight stored int8 (compile(trained_weights="int8"), docs/sparse.md): w is an I8
    # parameter with per-output-channel scales (its quantization record); y = w * scale[channel],
    # the float copy the float kernels read, made before each use. Its gradient ops' sink
    # updates the int8 codes: w <- clamp(round_half_even((w*s - lr*g) / s), -127, 127)
    OpSpec("DEQUANTIZE_W", 65, _s("w:I8 y:out"), ()),
    # CONV2D_Q8 depthwise (groups = channels) writing y over x, which nothing reads after it: each
    # int8 input channel is copied to s (one plane) before its output channel is written
    OpSpec("CONV2D_Q8_DW_INPLACE", 68, _s("x:I8 w:I8 b:I32? mult:I32 shift:I32 s:out:I8 y:out:I8"),
           CONV_ATTRS + Q8_CLAMP, inplace=(("y", "x"),)),
    # a 1x1 CONV2D (groups 1, stride 1, no padding) with O <= C output channels writing y over
    # the first O planes of x, which nothing reads after it: pixel by pixel, its C input values
    # are copied to s (C floats) before its O outputs are written
    OpSpec("CONV2D_PW_INPLACE", 69, _s("x w b? s:out y:out"), CONV_ATTRS, inplace=(("y", "x"),)),
    # CONV2D_PW_INPLACE with a frozen int8 weight (W8, above): the same bits on W' = float32(q) * scale[o]
    OpSpec("CONV2D_PW_INPLACE_W8", 67, _s("x w:I8 b? s:out y:out"), CONV_ATTRS, inplace=(("y", "x"),)),
    # an expansion block's float 1x1 conv (frozen int8 w, and the trained input channels xg of a split
    # weight in wt, int8, or wtf, float32; a weight trained whole is wt or wtf over xg = x without w),
    # its Clip (lo_bits, hi_bits) with the 1-bit mask m, and the depthwise conv dw
    # (the CONV attributes, groups = channels) after it, one channel at a time: the 1x1 output
    # exists only as s, one plane. With w2, the depthwise output's Clip (lo2_bits, hi2_bits; mask
    # m2) and the 1x1 conv w2 (bias b2) after it too: the depthwise output is then only y, one
    # plane, and the block's output is z. Each value is summed in the order of the ops replaced
    # (CONV2D_W8, CONV2D_ACC_W8, CLIP, MASK_PACK...), so y or z and the masks are theirs
    # (dw_stream.py, mt_pwdw_w8.c). The block has c_total channels, its constants (w, dw, w2's columns)
    # E rows (groups = E): all of them, or, for an op whose constants the plan streams in blocks
    # (stream.py), one block's, the op running once per block (block k: channels [k E, k E + E) of
    # c_total), the first making the masks and z's start, the others summing on, with the same bits
    # as one op; the trained tensors (b, db, wt), the masks and a y of every channel are the whole
    # block's
    OpSpec("PWDW_W8", 73, _s("x w:I8? b? xg? wt:I8? wtf? m:out:U8 dw:I8 db? s:out y:out m2:out:U8? w2:I8? b2? "
                             "z:out?"),
           CONV_ATTRS + ("lo_bits", "hi_bits", "lo2_bits", "hi2_bits", "c_total"), blocks=True),
    # its backward, a channel at a time: from dy, the depthwise output's gradient (with w2: the
    # block output's, through w2 and the mask m2 into s2, the depthwise bias db taking its gradient),
    # the depthwise input gradient through the mask m into s, then from that plane the frozen
    # part's input gradient dx, the trained part's dxg and weight gradient (sink wt, mt, acct; wt
    # int8 or float32) and the 1x1 bias's (sink b, mb, accb): no gradient of the block's inner
    # tensors exists whole. Run once per block of its constants, as PWDW_W8: the first block clears
    # dx and dxg, the others sum on
    OpSpec("PWDW_W8_BWD", 74, _s("dy w2:I8? m2:U8? s2:out? db:param? mdb:state? accdb:state? dw:I8 m:U8 s:out "
                                 "w:I8? dx:out? xg? wt:param? mt:state? acct:state? dxg:out? "
                                 "b:param? mb:state? accb:state?"), CONV_ATTRS + ("c_total",), blocks=True),
)
# attribute groups: ops that share one keep it at the start of their attributes,
# so one C name (MT_CONV_A_STRIDE_H, MT_POOL_A_KERNEL_H...) fits all of them
ATTR_GROUPS = {"CONV": CONV_ATTRS, "POOL": POOL_ATTRS}
OPS_BY_NAME = {op.name: op for op in OPS}
OPS_BY_CODE = {op.code: op for op in OPS}
W_LAYOUT_OUT_IN = 0   # Gemm weight stored [out, in] (Gemm transB=1, torch Linear)
W_LAYOUT_IN_OUT = 1   # Gemm weight stored [in, out] (MatMul, Gemm transB=0)

ROLE_CODES = {"in": 0, "out": 1, "param": 2, "state": 3}

ERRORS = (  # (name, message); code = position + 1, 0 is success
    ("MAGIC", "not a microtrain plan (bad magic)"),
    ("VERSION", "unsupported plan format version"),
    ("TRUNCATED", "plan is truncated (shorter than its size field)"),
    ("OVERSIZE", "plan buffer is longer than its size field (trailing bytes)"),
    ("CRC", "plan CRC mismatch (corrupted plan)"),
    ("HEADER", "invalid plan header field"),
    ("SECTION", "plan section out of bounds or misaligned"),
    ("TENSOR", "invalid tensor record"),
    ("OP", "invalid op record"),
    ("OPCODE", "unknown op code"),
    ("SHAPE", "tensor shapes do not fit the op"),
    ("ALIAS", "tensors overlap in memory where they must not"),
    ("NAME", "invalid tensor name"),
    ("ALIGN", "buffer is not 4-byte aligned"),
    ("RAM", "RAM buffer too small for the plan"),
    ("INPUT_LEN", "input has the wrong number of elements"),
    ("TARGET_LEN", "target has the wrong number of elements"),
    ("NONFINITE", "input contains NaN or infinity"),
    ("LABEL", "class label out of range"),
    ("LOSS", "loss is not finite; parameters were not updated"),
    ("NOT_TRAINABLE", "plan has no training ops"),
    ("INDEX", "index out of range"),
    ("PHASE", "op phases out of order or loss op misplaced"),
    ("OPTIM", "invalid optimizer settings"),
    ("DETACHED", "no plan loaded or no RAM attached"),
    ("OUTPUT_LEN", "output buffer has the wrong number of elements"),
    ("TARGET_KIND", "target kind does not match the loss (class label for cross-entropy, float targets for mse)"),
    ("TARGET_NONFINITE", "target contains NaN or infinity"),
    ("LR", "learning rate must be a finite number >= 0"),
    ("PARAM_LEN", "parameter data has the wrong number of elements"),
    ("PARAM_NONFINITE", "parameter data contains NaN or infinity"),
    ("STATE_LEN", "state blob has the wrong length for this plan"),
    ("STATE_CORRUPT", "state blob is corrupted (bad magic, version, field or CRC)"),
    ("STATE_PLAN", "state blob was saved with a different plan"),
    ("CHANGED", "plan bytes changed between mt_load and mt_attach"),
    ("GRAD", "gradient is not finite; parameters were not updated"),
    ("W8_SCALES", "an int8 weight of a float op needs one scale per output channel (a per-channel quantization "
                  "record along axis 0, zero points 0) and filters of at most 64 taps: recompile the plan"),
    ("PARAM_RANGE", "parameter value outside its int8 range (127 times its channel's scale): set a smaller value"),
    ("NO_INPUT", "the plan reads its input in place and none is set: mt_set_input first"),
    ("GROUP", "invalid stream group record (outside the stream section or the arena, or out of op order)"),
    ("STREAM_READ", "reading the plan's constants from its file failed (a read error, or the file is shorter "
                    "than the plan): the step stopped before the op that needed them"),
    ("STREAM_CRC", "constants read from the plan's file do not match their CRC (the file changed or was "
                   "damaged after the Trainer opened it): the step stopped before the op that needed them"),
)


def dtype_code(name):
    return DTYPES[name][0]


def dtype_size(code):
    for c, size in DTYPES.values():
        if c == code:
            return size
    raise KeyError(code)


def _offsets(fields):
    offs, pos = {}, 0
    for name, code in fields:
        offs[name] = pos
        pos += struct.calcsize("<" + code)
    return offs


def header_offsets():
    """Byte offset of each header field."""
    return _offsets(HEADER_FIELDS)


def tensor_offsets():
    return _offsets(TENSOR_FIELDS)


def state_offsets():
    return _offsets(STATE_FIELDS)


# ---- records: the one packing and unpacking of tensor and op records ----

def pack_tensor(**fields):
    """A tensor record from its TENSOR_FIELDS, by name."""
    return TENSOR_STRUCT.pack(*[fields[name] for name, _ in TENSOR_FIELDS])


def unpack_tensor(buf, pos):
    """{field: value} of the tensor record at byte pos of buf."""
    return dict(zip((name for name, _ in TENSOR_FIELDS), TENSOR_STRUCT.unpack_from(buf, pos)))


def pack_quant(**fields):
    """A quantization record from its QUANT_FIELDS, by name."""
    return QUANT_STRUCT.pack(*[fields[name] for name, _ in QUANT_FIELDS])


def unpack_quant(buf, pos):
    return dict(zip((name for name, _ in QUANT_FIELDS), QUANT_STRUCT.unpack_from(buf, pos)))


def quant_offsets():
    return _offsets(QUANT_FIELDS)


def group_offsets():
    return _offsets(GROUP_FIELDS)


def pack_group(**fields):
    """A group record (GROUP_FIELDS) from its fields, by name."""
    return GROUP_STRUCT.pack(*[fields[name] for name, _ in GROUP_FIELDS])


def unpack_group(buf, pos):
    return dict(zip((name for name, _ in GROUP_FIELDS), GROUP_STRUCT.unpack_from(buf, pos)))


def pack_op(code, phase, slots, attrs):
    """An op record; slots are tensor indices, None for an absent optional slot."""
    slots = [NO_TENSOR if s is None else s for s in slots]
    rec = OP_HEAD_STRUCT.pack(code, phase, len(slots), len(attrs)) + struct.pack("<%dH" % len(slots), *slots)
    rec += b"\0" * (-len(rec) % 4)
    return rec + struct.pack("<%di" % len(attrs), *attrs)


def unpack_op(buf, pos):
    """(code, phase, slots with None for absent ones, attrs, position of the next record)."""
    code, phase, nt, na = OP_HEAD_STRUCT.unpack_from(buf, pos)
    slots = struct.unpack_from("<%dH" % nt, buf, pos + OP_HEAD_BYTES)
    at = pos + OP_HEAD_BYTES + ((2 * nt + 3) & ~3)
    attrs = struct.unpack_from("<%di" % na, buf, at)
    return code, phase, [None if s == NO_TENSOR else s for s in slots], list(attrs), at + 4 * na


def c_header():
    """The text of modules/microtrain/mt_format.h."""
    L = ["/* Generated by `python host/microtrain/format.py` from host/microtrain/format.py.",
         " * Do not edit: change format.py and regenerate (make header). */",
         "#ifndef MT_FORMAT_H", "#define MT_FORMAT_H", "",
         '#define MT_MAGIC "%s"' % MAGIC.decode(),
         "#define MT_VERSION %d" % VERSION,
         "#define MT_ALIGN %d" % ALIGN,
         "#define MT_NO_TENSOR 0x%X" % NO_TENSOR,
         "#define MT_NO_NAME 0x%XU" % NO_NAME,
         "#define MT_MAX_SLOTS %d" % MAX_SLOTS,
         "#define MT_MAX_ATTRS %d" % MAX_ATTRS,
         "#define MT_MAX_DIMS %d" % MAX_DIMS,
         "#define MT_CRC_START %d" % CRC_START,
         "#define MT_OP_HEAD_BYTES %d" % OP_HEAD_BYTES, "",
         "/* header field byte offsets */",
         "#define MT_HEADER_BYTES %d" % HEADER_BYTES]
    for name, off in header_offsets().items():
        L.append("#define MT_H_%s %d" % (name.upper(), off))
    L += ["", "/* tensor record field byte offsets */", "#define MT_TENSOR_BYTES %d" % TENSOR_BYTES]
    for name, off in tensor_offsets().items():
        L.append("#define MT_T_%s %d" % (name.upper(), off))
    L += ["", "/* quantization record field byte offsets */", "#define MT_QUANT_BYTES %d" % QUANT_BYTES,
          "#define MT_NO_QUANT 0x%X" % NO_QUANT, "#define MT_PER_TENSOR 0x%X" % PER_TENSOR]
    for name, off in quant_offsets().items():
        L.append("#define MT_Q_%s %d" % (name.upper(), off))
    L += ["#define MT_QUANT_IN_DATA %d" % QUANT_IN_DATA, "#define MT_QUANT_IN_STREAM %d" % QUANT_IN_STREAM]
    L += ["", "/* stream group record field byte offsets */", "#define MT_GROUP_BYTES %d" % GROUP_BYTES,
          "#define MT_RESET_GROUP 0x%X" % RESET_GROUP]
    for name, off in group_offsets().items():
        L.append("#define MT_G_%s %d" % (name.upper(), off))
    L += ["", "/* training-state blob: header field byte offsets; the state region and a CRC-32 follow */",
          '#define MT_STATE_MAGIC "%s"' % STATE_MAGIC.decode(),
          "#define MT_STATE_VERSION %d" % STATE_VERSION,
          "#define MT_STATE_HEADER_BYTES %d" % STATE_HEADER_BYTES]
    for name, off in state_offsets().items():
        L.append("#define MT_S_%s %d" % (name.upper(), off))
    L += ["", "/* dtype codes and sizes */"]
    for name, (code, size) in DTYPES.items():
        L.append("#define MT_DTYPE_%s %d" % (name, code))
        L.append("#define MT_DTYPE_%s_SIZE %d" % (name, size))
    L += ["", "/* tensor storage */"]
    L += ["#define MT_STORAGE_%s %d" % kv for kv in STORAGES.items()]
    L += ["", "/* tensor flags */"]
    L += ["#define MT_TFLAG_%s %d" % kv for kv in TFLAGS.items()]
    L += ["", "/* op phases */"]
    L += ["#define MT_PHASE_%s %d" % kv for kv in PHASES.items()]
    L += ["", "/* losses */"]
    L += ["#define MT_LOSS_%s %d" % kv for kv in LOSSES.items()]
    L += ["", "/* gemm weight layouts */",
          "#define MT_W_LAYOUT_OUT_IN %d" % W_LAYOUT_OUT_IN,
          "#define MT_W_LAYOUT_IN_OUT %d" % W_LAYOUT_IN_OUT]
    L += ["", "/* ACT kinds */"]
    L += ["#define MT_ACT_KIND_%s %d" % kv for kv in ACT_KINDS.items()]
    L.append("#define MT_ACT_KIND_MAX %d" % max(ACT_KINDS.values()))
    L += ["", "/* slot roles */"]
    L += ["#define MT_ROLE_%s %d" % (k.upper(), v) for k, v in ROLE_CODES.items()]
    L += ["", "/* op codes, slot positions and attribute positions */"]
    for op in OPS:
        L.append("#define MT_OP_%s %d" % (op.name, op.code))
        L.append("#define MT_%s_NSLOTS %d" % (op.name, len(op.slots)))
        L.append("#define MT_%s_NATTRS %d" % (op.name, len(op.attrs)))
        for i, s in enumerate(op.slots):
            L.append("#define MT_%s_%s %d" % (op.name, s.name.upper(), i))
        for i, a in enumerate(op.attrs):
            L.append("#define MT_%s_A_%s %d" % (op.name, a.upper(), i))
    L.append("#define MT_OP_MAX %d" % max(op.code for op in OPS))
    L += ["", "/* every op, for the core's op table: X(NAME) per op; each kernel file defines mt_op_NAME */",
          "#define MT_FOR_EACH_OP(X) \\"]
    L += ["    X(%s) \\" % op.name for op in OPS]
    L[-1] = L[-1].rstrip(" \\")
    L += ["", "/* attribute groups: the same position in every op that has the group */"]
    for group, attrs in ATTR_GROUPS.items():
        for i, a in enumerate(attrs):
            L.append("#define MT_%s_A_%s %d" % (group, a.upper(), i))
    L += ["", "/* per-op slot table, indexed by op code: initialiser for mt_opspec_t[MT_OP_MAX + 1] */",
          "#define MT_SLOT(role, dtype, opt) ((uint8_t)((role) | ((dtype) << 2) | ((opt) << 7)))",
          "#define MT_SLOT_ROLE(s) ((s) & 3)", "#define MT_SLOT_DTYPE(s) (((s) >> 2) & 31)",
          "#define MT_SLOT_OPTIONAL(s) (((s) >> 7) & 1)",
          "#define MT_OPSPECS_INIT { \\", "    {0, 0, {0}, {255, 255, 255, 255}, 0}, \\"]
    for code in range(1, max(OPS_BY_CODE) + 1):
        op = OPS_BY_CODE.get(code)
        if op is None:
            L.append("    {0, 0, {0}, {255, 255, 255, 255}, 0}, \\")
            continue
        slots = ", ".join("MT_SLOT(%d, %d, %d)" % (ROLE_CODES[s.role], DTYPES[s.dtype][0], int(s.optional))
                          for s in op.slots)
        pairs = [(op.slot_index(o), op.slot_index(i)) for o, i in op.inplace]
        pairs += [(255, 255)] * (2 - len(pairs))
        inpl = ", ".join("%d, %d" % p for p in pairs)
        L.append("    {%d, %d, {%s}, {%s}, %d}, /* %s */ \\" % (len(op.slots), len(op.attrs), slots, inpl, int(op.blocks),
                                                                op.name))
    L.append("}")
    L += ["", "/* error codes */", "#define MT_OK 0"]
    for i, (name, _) in enumerate(ERRORS):
        L.append("#define MT_E_%s %d" % (name, i + 1))
    L.append("#define MT_E_COUNT %d" % (len(ERRORS) + 1))
    L.append("/* the messages as one string, NUL-separated: no pointer table to relocate */")
    L.append("#define MT_ERROR_MESSAGES \\")
    L.append('    "ok\\0" \\')
    for _, msg in ERRORS:
        L.append('    "%s\\0" \\' % msg)
    L[-1] = L[-1].rstrip(" \\")
    L += ["", "#endif /* MT_FORMAT_H */", ""]
    return "\n".join(L)


def markdown_tables():
    """The tables of docs/plan-format.md, generated so the document matches the code."""
    L = ["### Header (%d bytes)" % HEADER_BYTES, "", "| offset | field | type |", "|---|---|---|"]
    ctypes = {"B": "u8", "H": "u16", "I": "u32", "f": "f32"}
    for name, off in header_offsets().items():
        code = dict(HEADER_FIELDS)[name]
        L.append("| %d | `%s` | %s |" % (off, name, ctypes.get(code, "%s bytes" % code.rstrip("s"))))
    L += ["", "### Tensor record (%d bytes)" % TENSOR_BYTES, "", "| offset | field | type |", "|---|---|---|"]
    for name, off in tensor_offsets().items():
        L.append("| %d | `%s` | %s |" % (off, name, ctypes[dict(TENSOR_FIELDS)[name]]))
    L += ["", "### Quantization record (%d bytes)" % QUANT_BYTES, "", "| offset | field | type |", "|---|---|---|"]
    ctypes2 = dict(ctypes, i="i32")
    for name, off in quant_offsets().items():
        code = dict(QUANT_FIELDS)[name]
        L.append("| %d | `%s` | %s |" % (off, name, ctypes2.get(code, "%s bytes" % code.rstrip("s"))))
    L += ["", "### Stream group record (%d bytes)" % GROUP_BYTES, "", "| offset | field | type |", "|---|---|---|"]
    for name, off in group_offsets().items():
        L.append("| %d | `%s` | %s |" % (off, name, ctypes[dict(GROUP_FIELDS)[name]]))
    L += ["", "### Training-state blob (%d-byte header, then the state region, then a u32 CRC-32 of all before it)"
          % STATE_HEADER_BYTES, "", "| offset | field | type |", "|---|---|---|"]
    for name, off in state_offsets().items():
        code = dict(STATE_FIELDS)[name]
        L.append("| %d | `%s` | %s |" % (off, name, ctypes.get(code, "%s bytes" % code.rstrip("s"))))
    L += ["", "### Codes", "",
          "| kind | values |", "|---|---|",
          "| dtype (code, bytes) | %s |" % ", ".join("%s=%d (%d)" % (k, c, z) for k, (c, z) in DTYPES.items()),
          "| storage | %s |" % ", ".join("%s=%d" % kv for kv in STORAGES.items()),
          "| tensor flags (bits) | %s |" % ", ".join("%s=%d" % kv for kv in TFLAGS.items()),
          "| op phase | %s |" % ", ".join("%s=%d" % kv for kv in PHASES.items()),
          "| loss | %s |" % ", ".join("%s=%d" % kv for kv in LOSSES.items()),
          "| gemm w_layout | OUT_IN=%d (W is [out, in]), IN_OUT=%d (W is [in, out]) |" % (W_LAYOUT_OUT_IN, W_LAYOUT_IN_OUT),
          "| ACT kind | %s |" % ", ".join("%s=%d" % kv for kv in ACT_KINDS.items()),
          "", "### Ops", "",
          "Slots are tensor indices in this order (`?` optional: 0xFFFF when absent; role `out` is written, "
          "`param`/`state` are read and written; dtype F32 unless marked). Attributes are int32 in this order.",
          "", "| code | op | tensor slots | attributes | may run in place |", "|---|---|---|---|---|"]
    for op in OPS:
        slots = ", ".join("%s%s%s%s" % (s.name, "?" if s.optional else "", "" if s.role == "in" else " (%s)" % s.role,
                                          "" if s.dtype == "F32" else " " + s.dtype) for s in op.slots)
        inpl = ", ".join("%s = %s" % p for p in op.inplace) or "-"
        L.append("| %d | %s | %s | %s | %s |" % (op.code, op.name, slots, ", ".join(op.attrs) or "-", inpl))
    L += ["", "### Error codes", "", "| code | name | message |", "|---|---|---|", "| 0 | OK | ok |"]
    for k, (name, msg) in enumerate(ERRORS, start=1):
        L.append("| %d | %s | %s |" % (k, name, msg))
    return "\n".join(L) + "\n"


DOC_BEGIN = "<!-- generated: python host/microtrain/format.py --markdown -->\n"
DOC_END = "<!-- end generated -->"


def update_doc(path):
    """Replace the generated tables in docs/plan-format.md."""
    with open(path) as f:
        doc = f.read()
    start, end = doc.index(DOC_BEGIN) + len(DOC_BEGIN), doc.index(DOC_END)
    with open(path, "w") as f:
        f.write(doc[:start] + markdown_tables() + doc[end:])


if __name__ == "__main__":
    import sys
    if sys.argv[1:2] == ["--markdown"]:
        sys.stdout.write(markdown_tables())
    elif sys.argv[1:2] == ["--update-doc"]:
        update_doc(sys.argv[2])
    else:
        sys.stdout.write(c_header())
