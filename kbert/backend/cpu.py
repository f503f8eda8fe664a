"""What kbert asks of the CPU itself, read once (no backend involved, so every module may import
it: `kbert.backend.torch`'s int8 kernel and `kbert.export`'s ONNX int8 weights)."""

import functools


@functools.cache
def int8_products_saturate():
    """Whether this CPU's uint8 x int8 products can saturate at 8-bit inputs.

    x86 CPUs without VNNI multiply uint8 by int8 with an instruction (`vpmaddubsw`) whose int16
    pair sums saturate, so int8 kernels there (torch's quantized modules, onnxruntime's dynamic
    quantization) need one of the two operands on 7 bits (`reduce_range`). With VNNI
    (`avx512_vnni`, `avx_vnni`) the sums are int32 and the eighth bit is exact. Read from
    `/proc/cpuinfo`; where it cannot be read, `True` (7 bits are safe everywhere).
    ARM's kernels do not saturate; their flags list neither, and 7 bits cost little there.
    """
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = f.read()
    except OSError:
        return True
    return not (" avx512_vnni" in flags or " avx_vnni" in flags)
