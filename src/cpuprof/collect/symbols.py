"""Names for sampled addresses: ELF symbol tables, the kernel's symbols, and JIT perf maps.

Addresses are resolved in the process they were sampled in, against its own mappings
(/proc/self/maps). Headers and symbol tables are read with struct and numpy straight from the mapped
file: libtorch_cpu alone has half a million symbols, which a general ELF parser's per-symbol objects
would take seconds to walk, and even its header parsing took a third of a second. Code generated
at run time (oneDNN's JIT kernels) has no file: it is named from the perf map the generator writes
(/tmp/perf-<pid>.map, which oneDNN writes when ONEDNN_JIT_PROFILE=2), as perf itself does. An
address nothing names becomes "library+0x1a2b" (or "[jit] 0x7f..."), never dropped.
"""

from __future__ import annotations

import bisect
import functools
import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..model import NativeFrame

KERNEL_START = 0xFFFF800000000000

_SYM_DTYPE = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                       ("value", "<u8"), ("size", "<u8")])
_STT_FUNC, _STT_GNU_IFUNC = 2, 10


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    perms: str
    path: str  # "" for anonymous memory


def read_maps(pid: int | str = "self") -> list[Mapping]:
    maps = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        maps.append(Mapping(start, end, int(parts[2], 16), parts[1], parts[5] if len(parts) == 6 else ""))
    return maps


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 header
_PHDR_DTYPE = np.dtype([("type", "<u4"), ("flags", "<u4"), ("offset", "<u8"), ("vaddr", "<u8"), ("paddr", "<u8"),
                        ("filesz", "<u8"), ("memsz", "<u8"), ("align", "<u8")])
_SHDR_DTYPE = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
                        ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("addralign", "<u8"), ("entsize", "<u8")])
_PT_LOAD, _SHT_STRTAB, _SHT_NOBITS, _SHN_XINDEX, _PN_XNUM = 1, 3, 8, 0xFFFF, 0xFFFF


class ElfSymbols:
    """The function symbols of one ELF file, by address (the file's own virtual addresses)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.values = np.zeros(0, dtype=np.uint64)
        self.sizes = np.zeros(0, dtype=np.uint64)
        self.names = np.zeros(0, dtype=np.uint32)
        self.loads: list[tuple[int, int, int]] = []  # (file offset, vaddr, filesz) of PT_LOAD
        self.stripped = True
        self.function_starts = np.zeros(0, dtype=np.int64)  # from the unwind tables, sorted
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        sections = _read_headers(data)
        if sections is None:
            raise ValueError(f"{path}: not a 64-bit little-endian ELF file")
        self.loads, by_name, headers = sections
        hdr = by_name.get(".eh_frame_hdr")
        if hdr is not None and headers[hdr]["type"] != _SHT_NOBITS:
            offset, size = int(headers[hdr]["offset"]), int(headers[hdr]["size"])
            self.function_starts = _function_starts(data[offset:offset + size], int(headers[hdr]["addr"]))
        chosen = by_name.get(".symtab", by_name.get(".dynsym"))
        if chosen is None:
            return
        table = headers[chosen]
        if int(table["entsize"]) != _SYM_DTYPE.itemsize or table["type"] == _SHT_NOBITS \
                or not 0 < int(table["link"]) < len(headers):
            return
        strings = headers[int(table["link"])]
        if strings["type"] != _SHT_STRTAB or int(strings["offset"]) + int(strings["size"]) > len(data):
            raise ValueError(f"{path}: its symbol names' table is not a string table within the file")
        count = int(table["size"]) // _SYM_DTYPE.itemsize
        if int(table["offset"]) + count * _SYM_DTYPE.itemsize > len(data):
            raise ValueError(f"{path}: its symbol table runs past the end of the file")
        syms = np.frombuffer(data, dtype=_SYM_DTYPE, count=count, offset=int(table["offset"]))
        kind = syms["info"] & 0xF
        funcs = syms[((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (syms["value"] != 0)]
        order = np.argsort(funcs["value"], kind="stable")
        self.values = funcs["value"][order].copy()
        self.sizes = funcs["size"][order].copy()
        self.names = funcs["name"][order].copy()
        self._data = data
        self._strtab_offset = int(strings["offset"])
        self._strtab_end = self._strtab_offset + int(strings["size"])
        self.stripped = ".symtab" not in by_name

    def vaddr(self, file_offset: int) -> int | None:
        """The ELF virtual address of a byte at this offset in the file."""
        for offset, vaddr, filesz in self.loads:
            if offset <= file_offset < offset + max(filesz, 1):
                return vaddr + file_offset - offset
        return None

    def lookup(self, vaddr: int) -> str | None:
        # As a uint64 scalar: a Python int makes numpy search in float64, casting the whole table
        # (about 100 µs a lookup, most of a checkpoint's time in the decoding thread).
        i = int(self.values.searchsorted(np.uint64(vaddr), side="right")) - 1
        # Symbols can nest or overlap (aliases, cold parts): the closest start that still covers
        # the address, within a few steps back.
        for j in range(i, max(i - 4, -1), -1):
            start, size = int(self.values[j]), int(self.sizes[j])
            if start <= vaddr < start + max(size, 1) or (size == 0 and j == i):
                return self._name(int(self.names[j]))
        return None

    def function_start(self, vaddr: int) -> int | None:
        """The entry of the function holding ``vaddr`` by the unwind tables (which cover every
        function, symbol or not), so that a stripped library's samples still group by function."""
        i = int(self.function_starts.searchsorted(np.int64(vaddr), side="right")) - 1
        return int(self.function_starts[i]) if i >= 0 else None

    def _name(self, offset: int) -> str | None:
        """The name at ``offset`` in the string table; None where it lies outside it (a damaged file)."""
        start = self._strtab_offset + offset
        end = self._data.find(b"\0", start, self._strtab_end)
        return self._data[start:end].decode("utf-8", "replace") if start < self._strtab_end and end >= 0 else None


def _read_headers(data: mmap.mmap) -> tuple[list[tuple[int, int, int]], dict[str, int], np.ndarray] | None:
    """The PT_LOAD segments (file offset, vaddr, filesz), the sections' indices by name, and their
    headers, read straight from the file's bytes (a library's headers are a few kilobytes; a general ELF
    parser took a third of a second of the first save on libtorch's); None for anything but a 64-bit
    little-endian ELF file (x86-64, aarch64). ValueError where the headers point outside the file."""
    if len(data) < _EHDR.size or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (_ident, _type, _machine, _version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = _EHDR.unpack_from(data, 0)

    def table(offset: int, entsize: int, count: int, dtype: np.dtype) -> np.ndarray:
        if count and (entsize != dtype.itemsize or offset + count * entsize > len(data)):
            raise ValueError("ELF headers outside the file")
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset) if count else np.zeros(0, dtype)

    first = table(shoff, shentsize, 1, _SHDR_DTYPE)[0] if shoff else None
    if first is not None and phnum == _PN_XNUM:  # more segments than the header's field holds: in section 0
        phnum = int(first["info"])
    programs = table(phoff, phentsize, phnum, _PHDR_DTYPE)
    loads = [(int(p["offset"]), int(p["vaddr"]), int(p["filesz"])) for p in programs if p["type"] == _PT_LOAD]
    if first is not None and shnum == 0:  # more sections than the header's field holds: the count is in section 0
        shnum = int(first["size"])
    headers = table(shoff, shentsize, shnum, _SHDR_DTYPE) if shoff else np.zeros(0, _SHDR_DTYPE)
    if shstrndx == _SHN_XINDEX and len(headers):
        shstrndx = int(headers[0]["link"])
    by_name: dict[str, int] = {}
    if 0 < shstrndx < len(headers):
        names_at = int(headers[shstrndx]["offset"])
        names_end = min(names_at + int(headers[shstrndx]["size"]), len(data))
        for i, header in enumerate(headers):
            start = names_at + int(header["name"])
            end = data.find(b"\0", start, names_end)  # bounded: a damaged file cannot make this quadratic
            if start < names_end and end >= 0:
                by_name[data[start:end].decode("ascii", "replace")] = i  # the last of a name, as pyelftools
    return loads, by_name, headers


_DW_EH_PE_udata4, _DW_EH_PE_datarel_sdata4 = 0x03, 0x3B


def _function_starts(data: bytes, section_addr: int) -> np.ndarray:
    """Function entries from .eh_frame_hdr's binary-search table (in the encoding every
    toolchain writes: datarel sdata4 pairs); an empty array for anything else."""
    if len(data) < 12 or data[0] != 1 or data[2] != _DW_EH_PE_udata4 or data[3] != _DW_EH_PE_datarel_sdata4:
        return np.zeros(0, dtype=np.int64)
    ptr_size = {0x1B: 4, 0x03: 4, 0x0B: 4}.get(data[1])
    if ptr_size is None:
        return np.zeros(0, dtype=np.int64)
    count = int.from_bytes(data[4 + ptr_size:8 + ptr_size], "little")
    start = 8 + ptr_size
    table = np.frombuffer(data, dtype="<i4", count=min(count * 2, (len(data) - start) // 4), offset=start)
    return np.sort(table[0::2].astype(np.int64) + section_addr)


@functools.cache
def _elf(path: str, mtime_ns: int) -> ElfSymbols | None:
    try:
        return ElfSymbols(path)
    except (OSError, ValueError, Exception):  # not an ELF file, truncated, unreadable
        return None


def elf_symbols(path: str) -> ElfSymbols | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return _elf(path, stat.st_mtime_ns)


@functools.cache
def kernel_symbols() -> tuple[list[int], list[str]]:
    """Kernel text symbols, sorted; empty where kallsyms hides addresses (kptr_restrict)."""
    addresses, names = [], []
    try:
        with open("/proc/kallsyms") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tTwW":
                    address = int(parts[0], 16)
                    if address:
                        addresses.append(address)
                        names.append(parts[2])
    except OSError:
        return [], []
    order = sorted(range(len(addresses)), key=addresses.__getitem__)
    return [addresses[i] for i in order], [names[i] for i in order]


def read_perf_map(pid: int) -> list[tuple[int, int, str]] | None:
    """(start, size, name) entries of /tmp/perf-<pid>.map, sorted; None when there is none."""
    path = Path(f"/tmp/perf-{pid}.map")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    entries = []
    for line in text.splitlines():
        parts = line.split(maxsplit=2)
        if len(parts) == 3:
            try:
                # oneDNN numbers each generated instance of a kernel ("jit_brgemm_kernel_t.4"): the
                # kernel's name is what a reader compares, so instances are one frame.
                entries.append((int(parts[0], 16), int(parts[1], 16), _JIT_INSTANCE.sub("", parts[2].strip())))
            except ValueError:
                continue
    return sorted(entries)


_JIT_INSTANCE = re.compile(r"\.\d+$")


def demangle(name: str) -> str:
    if not name.startswith("_Z"):
        return name
    try:
        import cxxfilt

        return str(cxxfilt.demangle(name))
    except Exception:  # not installed, or a name it cannot parse: the mangled name is still a name
        return name


# (category, module pattern, name pattern): the first rule that matches names a frame's category.
_RULES: list[tuple[str, re.Pattern[str] | None, re.Pattern[str] | None]] = [
    ("kernel", re.compile(r"^\[kernel\]$"), None),
    ("openmp", re.compile(r"^lib(gomp|iomp5|omp)\b"), None),
    ("openmp", None, re.compile(r"^(gomp_|GOMP_|__kmp|__kmpc|kmp_|omp_)")),
    ("allocator", re.compile(r"^lib(jemalloc|tcmalloc)"), None),
    ("allocator", None, re.compile(r"^(malloc|free|calloc|realloc|cfree|posix_memalign|aligned_alloc|_int_malloc|"
                                   r"_int_free|_int_realloc|sysmalloc|malloc_consolidate|tcache_|__libc_(malloc|"
                                   r"free|calloc|realloc|memalign)|c10::alloc_cpu|c10::free_cpu|"
                                   r"c10::DefaultCPUAllocator|je_|tc_)")),
    ("interpreter", re.compile(r"^(python[0-9.]*|libpython)"), None),
    ("interpreter", None, re.compile(r"^(_Py|Py[A-Z_])")),
    ("compute", re.compile(r"^(\[jit\]|libmkl|libdnnl|libopenblas|libblis|libxsmm|libsleef)"), None),
    ("compute", None, re.compile(r"(^mkl_|^dnnl_|dnnl::impl|^jit_|zendnn|brgemm|gemm|gemv|sleef|"
                                 r"at::vec::|Sleef_|at::native::.*(kernel|Kernel|vectorized|loop|_impl)|"
                                 r"cpu_kernel|VectorizedLoop|vml::|fbgemm)")),
    ("framework", re.compile(r"^lib(torch|c10|shm)"), None),
]


def categorize(module: str, name: str) -> str:
    for category, module_re, name_re in _RULES:
        if module_re is not None and not module_re.search(module):
            continue
        if name_re is not None and not name_re.search(name):
            continue
        return category
    return "other"


# Frames resolved by earlier symbolizers of this process, by address and the file mapping it lies in
# (or the address alone in the kernel), with whether it was left unnamed: a followed process saves
# its profile every few seconds, and resolving every sampled address again at each save (the
# mapping's file stat'ed, its symbol looked up, the name demangled) was most of a checkpoint's
# time after the first. Generated code is not kept: its addresses are reused by other kernels.
# Kept as text, each build given frames of its own (a profile's frames are never another's).
# Bounded: emptied when full.
_RESOLVED: dict[tuple[int, int, int, str], tuple[str, str, str, bool]] = {}
_RESOLVED_MAX = 1 << 18


def forget_resolved() -> None:
    _RESOLVED.clear()


def warm_up(pid: int | str = "self") -> int:
    """Reads now what the first symbolization of ``pid``'s addresses needs: the kernel's symbols and
    those of every executable file mapped so far. A followed process does it as it starts (during
    an engine's own start-up), not at its first save, which would otherwise fall in its steady
    state. Returns the files read."""
    kernel_symbols()
    read = 0
    for mapping in read_maps(pid):
        if "x" in mapping.perms and mapping.path.startswith("/"):
            read += elf_symbols(mapping.path.removesuffix(" (deleted)")) is not None
    return read


class Symbolizer:
    """Resolves a process's sampled addresses to frames, caching per address."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid or os.getpid()
        self.maps = read_maps(self.pid)
        self._starts = [m.start for m in self.maps]
        self.perf_map = read_perf_map(self.pid)
        self._perf_starts = [e[0] for e in self.perf_map] if self.perf_map else []
        self.unresolved = 0

    @property
    def jit_symbols(self) -> str | None:
        return f"/tmp/perf-{self.pid}.map" if self.perf_map is not None else None

    def frame(self, pc: int) -> NativeFrame:
        return self._frame(pc)

    @functools.lru_cache(maxsize=1 << 17)  # noqa: B019  (one symbolizer per profile build)
    def _frame(self, pc: int) -> NativeFrame:
        key = self._key(pc)
        if key is not None:
            known = _RESOLVED.get(key)
            if known is not None:
                name, module, category, unnamed = known
                self.unresolved += unnamed
                return NativeFrame(name=name, module=module, category=category)
        before = self.unresolved
        frame = self._resolve(pc)
        if key is not None:
            if len(_RESOLVED) >= _RESOLVED_MAX:
                _RESOLVED.clear()
            _RESOLVED[key] = (frame.name, frame.module, frame.category, self.unresolved > before)
        return frame

    def _key(self, pc: int) -> tuple[int, int, int, str] | None:
        """What a frame resolved from ``pc`` depends on: the address and, outside the kernel, the
        file mapping it lies in; None for anonymous memory."""
        if pc >= KERNEL_START:
            return (pc, 0, 0, "[kernel]")
        i = bisect.bisect_right(self._starts, pc) - 1
        if i < 0 or pc >= self.maps[i].end or not self.maps[i].path.startswith("/"):
            return None
        mapping = self.maps[i]
        return (pc, mapping.start, mapping.offset, mapping.path)

    def _resolve(self, pc: int) -> NativeFrame:
        if pc >= KERNEL_START:
            addresses, names = kernel_symbols()
            i = bisect.bisect_right(addresses, pc) - 1
            if i >= 0:
                return NativeFrame(name=names[i], module="[kernel]", category="kernel")
            self.unresolved += 1
            return NativeFrame(name=f"[kernel] {pc:#x}", module="[kernel]", category="kernel")
        i = bisect.bisect_right(self._starts, pc) - 1
        mapping = self.maps[i] if i >= 0 and pc < self.maps[i].end else None
        if mapping is not None and mapping.path.startswith("/"):
            module = os.path.basename(mapping.path.removesuffix(" (deleted)"))
            elf = elf_symbols(mapping.path.removesuffix(" (deleted)"))
            file_offset = pc - mapping.start + mapping.offset
            vaddr = elf.vaddr(file_offset) if elf is not None else None
            name = elf.lookup(vaddr) if elf is not None and vaddr is not None else None
            if name is None:
                self.unresolved += 1
                # No symbol: named by its library and the function's entry (its first byte's file
                # offset), or the address's own offset where the unwind tables do not cover it.
                entry = elf.function_start(vaddr) if elf is not None and vaddr is not None else None
                offset = file_offset - (vaddr - entry) if entry is not None and vaddr is not None else file_offset
                return NativeFrame(name=f"{module}+{offset:#x}", module=module, category=categorize(module, ""))
            name = demangle(name)
            return NativeFrame(name=name, module=module, category=categorize(module, name))
        # Anonymous executable memory: code generated at run time.
        if self.perf_map:
            j = bisect.bisect_right(self._perf_starts, pc) - 1
            if j >= 0:
                start, size, name = self.perf_map[j]
                if pc < start + size:
                    return NativeFrame(name=name, module="[jit]", category="compute")
        self.unresolved += 1
        if mapping is None:
            return NativeFrame(name=f"[unknown] {pc:#x}", module="[unknown]", category="other")
        # Unnamed generated code: one frame per generated region, not per instruction.
        return NativeFrame(name=f"[jit code at {mapping.start:#x}]", module="[jit]", category="compute")
