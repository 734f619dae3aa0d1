"""The CUDA snippets as text: what jittor's source handling requires of them."""
import re

import pytest

from ops import _codegen

SNIPPETS = sorted([p.stem for p in _codegen.snippet_dir().glob("*.cuh")] +
                  [p.name for p in _codegen.snippet_dir().glob("*.h")])


@pytest.mark.parametrize("name", SNIPPETS)
def test_the_last_include_is_unconditional(name):
    """jittor inserts its JIT defines (in0_type, index_t, ...) right after the last ``#include`` of the source;
    were that include inside an #if/#else branch, the defines would be hidden from the other branch (seen on the
    H100: 'identifier "in0_type" is undefined' in every timex kernel). An include of one platform's header
    (immintrin.h) may sit in a conditional before it."""
    depth, last = 0, None
    for lineno, line in enumerate(_codegen.snippet(name).splitlines(), 1):
        directive = line.strip()
        if re.match(r"#\s*if", directive):
            depth += 1
        elif re.match(r"#\s*endif", directive):
            depth -= 1
        elif re.match(r"#\s*include", directive):
            last = (lineno, depth)
    assert depth == 0, f"{name}: unbalanced #if/#endif"
    assert last is None or last[1] == 0, f"{name}:{last[0]}: the last #include is inside a preprocessor conditional"


def test_a_conditional_last_include_is_caught(monkeypatch):
    text = "#pragma once\n#include <cstdint>\n#if defined(__AVX2__)\n#include <immintrin.h>\n#endif\n"
    monkeypatch.setattr(_codegen, "snippet", lambda name: text)
    with pytest.raises(AssertionError, match="the last #include"):
        test_the_last_include_is_unconditional("made_up")


@pytest.mark.parametrize("name", SNIPPETS)
def test_snippets_are_ascii(name):
    """The header text becomes part of jittor's kernel key, whose fields are separated by a non-ASCII mark."""
    assert _codegen.snippet(name).isascii()


def test_header_dedups_and_render_requires_every_value():
    text = _codegen.header(["common", "common"])
    assert text.count("ops_ceil_div(T a") == 1
    assert _codegen.render("f<${T}>(${N})", T="float", N=4) == "f<float>(4)"
    with pytest.raises(KeyError):
        _codegen.render("f<${T}>", N=4)


def test_index_type_switches_above_int32():
    assert _codegen.index_type(2**31 - 1) == "int"
    assert _codegen.index_type(2**31) == "long long"


def test_include_lines_carry_each_files_hash():
    """A header is a few #include lines: jittor keys its kernel cache on that text, so each line carries its
    file's content hash (an edited snippet changes the key) and jittor's half types come first."""
    text = _codegen.include(("common", "pool3d"))
    lines = text.splitlines()
    assert lines[0] == '#include "type/fp16_compute.h"' and len(text) < 400
    for line, name in zip(lines[1:], ("common", "pool3d")):
        path = str(_codegen.snippet_path(name))
        assert line == f'#include "{path}"  // {_codegen.snippet_digest(name)}'
    # common.cuh includes index_math.h and ops_data.h: its hash covers the three, a header of text inlines them
    files = [p.name for p in _codegen.depends("common")]
    assert files == ["index_math.h", "ops_data.h", "common.cuh"]
    every = "".join(_codegen.snippet(name) for name in files)
    assert _codegen.snippet_digest("common") == _codegen._digest(every) != _codegen._digest(_codegen.snippet("common"))
    text = _codegen.header(["common", "permute"])
    assert '# include "' not in text and text.index("struct OpsDivisor") < text.index("ops_ceil_div(T a")


def test_generated_files_are_named_by_their_content(tmp_path, monkeypatch):
    monkeypatch.setattr(_codegen, "_generated_dir", lambda: tmp_path)
    _codegen.generated.cache_clear()
    try:
        a = _codegen.generated("menu", "int a;\n")
        assert a == _codegen.generated("menu", "int a;\n") and a != _codegen.generated("menu", "int b;\n")
        files = sorted(p.name for p in tmp_path.iterdir())
        assert len(files) == 2 and all(f.startswith("menu-") and f.endswith(".cuh") for f in files)
        path = a.split('"')[1]
        assert open(path).read() == "int a;\n"
    finally:
        _codegen.generated.cache_clear()


def test_menu_switches_over_its_entries_in_order():
    menu = _codegen.Menu([("a", 1), ("b", 2), ("a", 1)], lambda e: f"f<{e[0]}, {e[1]}>()")
    assert menu.entries == (("a", 1), ("b", 2)) and menu.index(("b", 2)) == 1 and ("c", 3) not in menu
    text = menu.render("void g(int v)", "op")
    assert "case 0: f<a, 1>(); return;" in text and "case 1: f<b, 2>(); return;" in text
    assert 'LOGf << "op: no kernel "' in text


def test_a_code_op_runs_with_an_included_header():
    """The CPU path of the same mechanism (jittor resolves the absolute include, and hashes the file)."""
    import numpy as np
    from ops._jittor import jt
    x = jt.array(np.arange(6, dtype=np.float32))
    y = jt.code(x.shape, x.dtype, [x], cpu_header=_codegen.include(("pool3d_gather",)),
                cpu_src="for (int i = 0; i < in0_shape0; ++i) out0_p[i] = 2 * in0_p[i];")
    np.testing.assert_array_equal(y.numpy(), 2 * np.arange(6, dtype=np.float32))


def test_cpu_common_is_found_and_packaged():
    """The CPU helpers ship with the CUDA snippets (setup.cfg's package_data) and snippet() finds them by name."""
    import configparser
    from pathlib import Path

    assert "ops_cpu_bfloat16" in _codegen.snippet("cpu_common.h")
    assert _codegen.snippet("common") == _codegen.snippet("common.cuh")
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    patterns = [p.strip() for p in cfg["options.package_data"]["ops.cuda_snippets"].split(",")]
    for path in _codegen.snippet_dir().iterdir():
        if path.suffix in (".cuh", ".h"):
            assert any(path.match(p) for p in patterns), path.name


def test_tuning_doc_lists_every_switch_and_its_values():
    """docs/tuning.md (linked from the README) describes each OPS_* A/B switch with the values the code takes."""
    from pathlib import Path

    import ops  # noqa: F401  (every family registers its switches at import)
    from ops import _launch

    doc = (Path(__file__).resolve().parent.parent / "docs" / "tuning.md").read_text()
    switches = _launch._SWITCH_MODES
    assert len(switches) == 2
    for name, values in switches.items():
        row = next(line for line in doc.splitlines() if line.startswith(f"| `{name}` |"))
        assert all(f"`{v}`" in row for v in values), (name, values, row)
        assert f"## {name}\n" in doc, name
