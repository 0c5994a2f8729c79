"""ELF headers and symbols read by cpuprof's own reader, against known answers: a libc function's
address (taken by ctypes in this process) names that function, and the segments and sections agree
with binutils' readelf on the same file; damaged files name no symbol and raise nothing."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cpuprof.collect import symbols
from cpuprof.collect.symbols import ElfSymbols, Symbolizer, _read_headers, read_maps


def _libc_path() -> str:
    address = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    mapping = next(m for m in read_maps() if m.start <= address < m.end)
    return mapping.path


def test_a_libc_function_is_named_from_its_address_in_this_process():
    """The name given to an address inside a function is one the dynamic linker resolves back to that
    function's address (an alias such as strtoimax for strtol is the same function)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    for name in ("getpid", "qsort", "strtol"):  # not an IFUNC: its implementation is a local, stripped symbol
        address = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        assert address is not None
        frame = Symbolizer().frame(address + 1)  # inside the function, as a sampled pc is
        assert frame.module.startswith("libc"), frame
        try:
            resolved = ctypes.cast(getattr(libc, frame.name), ctypes.c_void_p).value
        except AttributeError:  # a local alias (__GI_getpid) of a libc that keeps .symtab: not exported
            mapping = next(m for m in read_maps() if m.start <= address < m.end)
            elf = symbols.elf_symbols(mapping.path)
            assert elf is not None
            vaddr = elf.vaddr(address - mapping.start + mapping.offset)
            assert vaddr is not None and vaddr in set(int(v) for v in elf.values), (name, frame)
            continue
        assert resolved == address, (name, frame)


def test_a_later_symbolizer_takes_what_an_earlier_one_resolved_in_the_same_mapping(monkeypatch: pytest.MonkeyPatch):
    """A checkpoint's symbolizer does not resolve again what an earlier save resolved: the same frame,
    and the same count of unnamed addresses, with no resolution at all; an address whose mapping
    is not the one it was resolved in is resolved again."""
    symbols.forget_resolved()
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    address = ctypes.cast(libc.qsort, ctypes.c_void_p).value
    assert address is not None
    mapping = next(m for m in read_maps() if m.start <= address < m.end)
    unnamed = mapping.end - 1  # past the last function, most likely; named or not, counted the same
    first = Symbolizer()
    named, last = first.frame(address + 1), first.frame(unnamed)

    def resolve_again(self: Symbolizer, pc: int) -> None:
        raise AssertionError(f"{pc:#x} resolved again")

    with monkeypatch.context() as patched:
        patched.setattr(Symbolizer, "_resolve", resolve_again)
        later = Symbolizer()
        assert later.frame(address + 1) == named and later.frame(unnamed) == last
        assert later.unresolved == first.unresolved
    moved = Symbolizer()
    moved.maps = [symbols.Mapping(m.start, m.end, m.offset + 4096 if m == mapping else m.offset, m.perms, m.path)
                  for m in moved.maps]
    resolved: list[int] = []
    monkeypatch.setattr(Symbolizer, "_resolve", lambda self, pc: resolved.append(pc) or named)
    moved.frame(address + 1)
    assert resolved == [address + 1]


def test_warming_up_reads_the_kernels_symbols_and_every_mapped_executable_files():
    symbols._elf.cache_clear()
    symbols.kernel_symbols.cache_clear()
    assert symbols.warm_up() >= 1
    assert symbols.kernel_symbols.cache_info().currsize == 1
    hits = symbols._elf.cache_info().hits
    symbols.elf_symbols(_libc_path())
    assert symbols._elf.cache_info().hits == hits + 1  # read as it warmed up


@pytest.mark.skipif(shutil.which("readelf") is None, reason="binutils' readelf is not installed")
def test_segments_and_sections_agree_with_readelf():
    path = _libc_path()
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    read = _read_headers(data)
    assert read is not None
    loads, by_name, headers = read
    program = subprocess.run(["readelf", "-lW", path], capture_output=True, text=True, check=True).stdout
    expected = [(int(off, 16), int(vaddr, 16), int(filesz, 16)) for off, vaddr, filesz in
                re.findall(r"^\s*LOAD\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+\s+(0x[0-9a-f]+)", program, re.M)]
    assert loads == expected and loads
    sections = subprocess.run(["readelf", "-SW", path], capture_output=True, text=True, check=True).stdout
    listed = re.findall(r"^\s*\[\s*(\d+)\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", sections, re.M)
    named = {name: (int(index), int(addr, 16), int(offset, 16), int(size, 16)) for index, name, addr, offset, size
             in listed if name != "NULL"}
    assert named and {name for name in named} <= set(by_name)
    for name, (index, addr, offset, size) in named.items():
        header = headers[by_name[name]]
        assert by_name[name] == index and (int(header["addr"]), int(header["offset"]), int(header["size"])) == \
            (addr, offset, size), name


def test_damaged_files_name_nothing_and_raise_nothing(tmp_path: Path):
    whole = Path(_libc_path()).read_bytes()
    truncated = tmp_path / "libtruncated.so"
    truncated.write_bytes(whole[:4096])  # the headers' tables point past its end
    not_elf = tmp_path / "libtext.so"
    not_elf.write_bytes(b"not an ELF file at all" * 10)
    empty = tmp_path / "libempty.so"
    empty.write_bytes(b"")
    wrong_class = tmp_path / "lib32.so"
    wrong_class.write_bytes(b"\x7fELF\x01\x01" + whole[6:4096])  # a 32-bit header: not read
    with pytest.raises(ValueError):
        ElfSymbols(str(truncated))
    for path in (truncated, not_elf, empty, wrong_class):
        assert symbols.elf_symbols(str(path)) is None, path
    # A symbol table whose size runs past the file: refused, not read out of bounds.
    read = _read_headers(mmap.mmap(-1, len(whole)))  # anonymous zeros: no ELF magic
    assert read is None
    swollen = bytearray(whole)
    with open(_libc_path(), "rb") as f:
        loads, by_name, headers = _read_headers(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    table = by_name.get(".symtab", by_name.get(".dynsym"))
    assert table is not None
    ehdr = symbols._EHDR.unpack_from(whole, 0)
    at = ehdr[6] + table * symbols._SHDR_DTYPE.itemsize + symbols._SHDR_DTYPE.fields["size"][1]
    swollen[at:at + 8] = np.uint64(len(whole) * 4).tobytes()
    (tmp_path / "libswollen.so").write_bytes(bytes(swollen))
    with pytest.raises(ValueError, match="past the end"):
        ElfSymbols(str(tmp_path / "libswollen.so"))
    # A symbol whose name lies outside its string table names nothing (the frame falls back to lib+offset).
    whole_elf = ElfSymbols(_libc_path())
    assert len(whole_elf.values) and whole_elf._name(10**9) is None
