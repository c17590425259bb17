"""The `ignis` command line: help, CPU report, and one clear line (not a traceback) on bad input."""
import subprocess
import sys


from ignis.api.cli import main


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ignis", *args], capture_output=True, text=True,
                          timeout=300, env=env)


def test_help_lists_commands():
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("pull", "list", "show", "inspect", "models", "bench", "cpu", "run", "chat", "serve",
                "compile"):
        assert cmd in r.stdout


def test_no_command_prints_help_and_exits_2(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_cpu_reports_the_active_table(capsys):
    from ignis import _core
    assert main(["cpu"]) == 0
    out = capsys.readouterr().out
    assert f"* {_core.active_kernels()}" in out
    assert "generic" in out
    for t in _core.kernel_tables():                 # a table without an x16 kernel says so
        line = next(l for l in out.splitlines() if l[3:].split()[0] == t["name"])
        assert ("gguf weights run the portable C code" in line) == (
            "matmul_x16" in t["portable"] and t["name"] != "generic")


def test_unknown_model_is_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    assert main(["show", str(tmp_path / "no-such-model")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ignis show: error:")
    assert "Traceback" not in err


def test_unknown_registry_name_on_pull(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    assert main(["pull", "gpt-17-ultra"]) == 1
    err = capsys.readouterr().err
    assert "gpt-17-ultra" in err and "qwen2.5-coder-0.5b-instruct" in err


def test_show_on_a_tiny_model_dir(tiny_qwen2_dir, capsys):
    assert main(["show", str(tiny_qwen2_dir), "-q"]) == 0
    out = capsys.readouterr().out
    assert "qwen2: 2 layers" in out
    assert "tied lm_head" in out


def test_bad_argument_is_argparse_error():
    r = run_cli("show")
    assert r.returncode == 2
    assert "the following arguments are required: model" in r.stderr


def test_inspect_reports_seed_figures_on_tiny_model(tiny_qwen2_dir, capsys):
    assert main(["inspect", str(tiny_qwen2_dir), "-q", "--tokens", "4", "--context", "64"]) == 0
    out = capsys.readouterr().out
    assert "ignis inspect: qwen2, 2 layers" in out
    # 18 ops per layer + final rmsnorm (2) + lm_head (1), at the seed's granularity
    assert f"{18 * 2 + 3:>5}" in out


def test_inspect_refuses_context_shorter_than_tokens(tiny_qwen2_dir, capsys):
    assert main(["inspect", str(tiny_qwen2_dir), "-q", "--tokens", "8", "--ctx", "4"]) == 1
    assert "--ctx (4) must be >= --tokens (8)" in capsys.readouterr().err
    assert main(["inspect", str(tiny_qwen2_dir), "-q", "--tokens", "8", "--context", "4"]) == 1
    assert "--ctx (4) must be >= --tokens (8)" in capsys.readouterr().err     # --context: an alias


def test_closed_pipe_is_not_a_traceback():
    # `ignis cpu | head -1`: the reader closes the pipe after one line.
    p = subprocess.Popen([sys.executable, "-m", "ignis", "cpu"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert err == ""


def test_os_errors_are_one_line(tmp_path, monkeypatch, capsys):
    # IGNIS_HOME cannot be created: the cache directory is below a regular file.
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("IGNIS_HOME", str(blocker / "home"))
    monkeypatch.setattr("ignis.loader.registry.is_imported", lambda *a, **k: False)
    assert main(["pull", "qwen2.5-coder-0.5b-instruct", "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ignis pull: error:") and "Traceback" not in err


def test_models_lists_the_cache(tiny_qwen2_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("IGNIS_HOME", str(tmp_path / "home"))
    assert main(["models"]) == 0
    assert "(empty" in capsys.readouterr().out
    import shutil
    shutil.copytree(tiny_qwen2_dir, tmp_path / "home" / "models" / "tiny")
    from ignis.loader.resolve import open_model
    from ignis.runtime.engine import Engine
    Engine(open_model(tmp_path / "home" / "models" / "tiny"), n_ctx=16, weight_format="q8")
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "tiny" in out and "q8 " in out and "1 model(s)" in out


def test_bench_prints_a_row_per_test(tiny_qwen2_dir, capsys):
    assert main(["bench", str(tiny_qwen2_dir), "--prompt-tokens", "8,16", "--gen-tokens", "4",
                 "--weights", "f32,q8", "--runs", "2", "--threads", "1", "-q"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[1], r[3]) for r in rows] == [(w, t) for w in ("f32", "q8") for t in ("pp8", "pp16", "tg4")]
    assert all(float(r[4]) > 0 for r in rows)


def test_bench_refuses_bad_values(tiny_qwen2_dir, capsys):
    assert main(["bench", str(tiny_qwen2_dir), "--prompt-tokens", "8,x", "-q"]) == 1
    assert "--prompt-tokens takes numbers" in capsys.readouterr().err
    assert main(["bench", str(tiny_qwen2_dir), "--gen-tokens", "0", "-q"]) == 1


# --- messages for the CLI user --------------------------------------------------------------------

def test_warnings_are_one_plain_line_and_the_library_keeps_real_ones(tiny_qwen2_dir, tmp_path,
                                                                     capsys):
    import json
    import shutil
    import warnings

    import pytest

    from ignis.loader.config import UnknownConfigKeyWarning
    from ignis.loader.resolve import open_model
    d = tmp_path / "odd"
    shutil.copytree(tiny_qwen2_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "frobnicate": 3}))
    shown_before = warnings.showwarning
    assert main(["show", str(d), "-q"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "warning" in line]
    assert len(lines) == 1 and "'frobnicate'" in lines[0]
    assert lines[0].startswith("ignis: warning: config.json (")
    assert ".py:" not in err and "UnknownConfigKeyWarning" not in err    # no source path, class, code
    assert warnings.showwarning is shown_before
    with pytest.warns(UnknownConfigKeyWarning):                            # Python callers: a warning
        open_model(d).weights.close()


def test_portable_kernel_warning_is_one_line_naming_the_flag(tmp_path):
    from test_gguf_import import write_gguf
    src = tmp_path / "tiny.gguf"
    write_gguf(src, "qwen2")
    import os
    env = {**os.environ, "IGNIS_KERNELS": "generic", "IGNIS_HOME": str(tmp_path / "home")}
    r = run_cli("bench", str(src), "--weights", "gguf", "--prompt-tokens", "4", "--gen-tokens", "2",
                "--runs", "1", "--threads", "1", "-q", env=env)
    assert r.returncode == 0, r.stderr
    [line] = r.stderr.splitlines()                # one line: no source path, no code line
    assert line.startswith("ignis: warning: --weights gguf has no generic kernel")
    assert "weight_format" not in line and "RuntimeWarning" not in line


def test_errors_name_the_flags_not_python_arguments(tiny_chat_dir, capsys):
    # (flags, words the one-line error must hold); none may leak a Python argument name
    cases = [
        (["--ctx", "0"], "--ctx must be a positive integer"),
        (["--ctx", "100000"], "--ctx 100000 exceeds the 512 positions this model supports"),
        (["--threads", "0"], "--threads must be 1 or more"),
        (["--weights", "gguf"], "--weights gguf reads the blocks of the GGUF file"),
        (["--top-k", "-1"], "--top-k must be an integer >= 0"),
        (["--max-tokens", "0"], "--max-tokens must be an integer >= 1"),
        (["--repetition-penalty", "0"], "--repetition-penalty must be a number"),
        (["--stop", "a", "--stop", "b", "--stop", "c", "--stop", "d", "--stop", "e"],
         "--stop takes at most 4 strings"),
    ]
    for flags, words in cases:
        assert main(["run", str(tiny_chat_dir), "hi", "-q", *flags]) == 1, flags
        err = capsys.readouterr().err
        assert err.startswith("ignis run: error: ") and err.count("\n") == 1, err
        assert words in err, err
        assert "Use --ctx <= 512" in err if flags == ["--ctx", "100000"] else True
        for name in ("n_ctx", "weight_format", "threads=", "top_k", "max_tokens",
                     "repetition_penalty", "kv_dtype"):
            assert name not in err, err


def test_kv_cache_refusal_names_ctx_and_parallel():
    from ignis.api.cli import cli_wording
    from ignis.generate.errors import context_length_message
    msg = ("a KV cache of n_ctx=512 positions x 8 slots needs 9 bytes (...), more than this "
           "machine's 1 bytes; use n_ctx <= 3, fewer parallel slots or kv_dtype='f16'")
    assert cli_wording(msg) == ("a KV cache of --ctx 512 positions x 8 slots needs 9 bytes (...), "
                                "more than this machine's 1 bytes; use --ctx <= 3 or a smaller "
                                "--parallel")
    assert (cli_wording("parallel must be a positive integer, got 0")
            == "--parallel must be a positive integer, got 0")
    said = cli_wording(context_length_message(128, 200))
    assert "--ctx 128" in said and "ignis.load" not in said and "n_ctx" not in said


def test_wording_never_rewrites_the_users_text(tiny_chat_dir, monkeypatch, capsys):
    # A stop string is the user's text: the error about it names --stop and quotes it as typed
    # ($'max_tokens=5 \xff' reaches Python as a lone surrogate).
    loads = []
    monkeypatch.setattr("ignis.api.load.load", lambda *a, **k: loads.append(a))
    for command in ("run", "chat"):
        argv = [command, str(tiny_chat_dir), *(["hi"] if command == "run" else []), "-q",
                "--stop", "max_tokens=5 \udcff"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"ignis {command}: error: --stop string 'max_tokens=5 \\udcff' holds "
                              f"a lone UTF-16 surrogate"), err
        assert "--max-tokens" not in err
    assert loads == []


def test_wording_passes_over_quoted_text_and_paths():
    from ignis.api.cli import cli_wording
    assert cli_wording(
        "weight_format='gguf' needs the GGUF file this model was imported from, "
        "/models/top_k/my-top_p.gguf, which is missing; import it again or use weight_format='q8'"
    ) == ("--weights gguf needs the GGUF file this model was imported from, "
          "/models/top_k/my-top_p.gguf, which is missing; import it again or use --weights q8")
    for kept in ("ignoring unreadable conversion cache C:\\top_k\\n_ctx=4.npz: ValueError('top_p')",
                 "could not store my-top_p.gguf (max_tokens=3.bin): top_k/ is read-only",
                 'logit_bias key "it\'s top_k" is not a token id',
                 "stop_words n_ctx_train my_top_k"):
        assert cli_wording(kept) == kept
    # the structured parameter: only the name the message starts with is the flag
    assert (cli_wording("stop string 'top_k n_ctx=4' is bad", param="stop")
            == "--stop string 'top_k n_ctx=4' is bad")
    assert (cli_wording("top_p must be a number in (0, 1], got 0", param="top_p")
            == "--top-p must be a number in (0, 1], got 0")
    assert cli_wording("logit_bias key 'top_k' is not a token id", param="logit_bias") == (
        "logit_bias key 'top_k' is not a token id")


def test_a_warning_keeps_its_paths(capsys):
    from ignis.api.cli import _show_warning
    _show_warning(RuntimeWarning("ignis: ignoring unreadable conversion cache "
                                 "/home/me/.ignis/top_k/my-top_p.gguf.npz: EOFError()"),
                  RuntimeWarning, "x.py", 1)
    assert capsys.readouterr().err == ("ignis: warning: ignoring unreadable conversion cache "
                                       "/home/me/.ignis/top_k/my-top_p.gguf.npz: EOFError()\n")


def test_file_field_errors_keep_their_names(tiny_chat_dir, tmp_path, capsys):
    # generation_config.json's repetition_penalty is the file's field, not --repetition-penalty
    import json
    import shutil
    d = tmp_path / "m"
    shutil.copytree(tiny_chat_dir, d)
    g = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**g, "repetition_penalty": 0}))
    assert main(["run", str(d), "hi", "-q"]) == 1
    err = capsys.readouterr().err
    assert "repetition_penalty" in err and "--repetition-penalty" not in err


def test_bench_validates_every_value_before_the_table(tiny_qwen2_dir, monkeypatch, capsys):
    opened = []
    monkeypatch.setattr("ignis.loader.resolve.open_model", lambda *a, **k: opened.append(a))
    cases = ((["--weights", "f32,q3"], "--weights takes formats from f32, bf16, q8, q4, gguf"),
             (["--weights", ","], "--weights takes formats"),
             (["--threads", "0"], "--threads must be 1 or more"))
    for flags, words in cases:
        assert main(["bench", str(tiny_qwen2_dir), "-q", *flags]) == 1
        out, err = capsys.readouterr()
        assert out == "" and words in err, (flags, out, err)
    assert opened == []                                  # refused before the model was opened


def test_bench_prints_no_table_for_a_format_the_model_refuses(tiny_qwen2_dir, capsys):
    assert main(["bench", str(tiny_qwen2_dir), "--weights", "gguf", "--prompt-tokens", "4",
                 "--gen-tokens", "2", "--runs", "1", "--threads", "1", "-q"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "--weights gguf reads the blocks" in err


def test_a_missing_gguf_path_says_it_does_not_exist(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "model.gguf"
    for command in (["show", str(missing)], ["run", str(missing), "hi", "-q"],
                    ["bench", str(missing), "-q"], ["inspect", str(missing), "-q"]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert err == f"ignis {command[0]}: error: the .gguf file {str(missing)!r} does not exist\n"


def test_show_prints_the_eos_ids_generation_stops_at(tiny_chat_dir, tmp_path, capsys):
    import json
    import shutil

    import ignis

    def eos_line(d) -> str:
        assert main(["show", str(d), "-q"]) == 0
        out = capsys.readouterr().out
        return next(line for line in out.splitlines() if line.startswith("eos ids"))

    def stops(d) -> tuple[int, ...]:
        m = ignis.load(str(d), n_ctx=16, threads=1, progress=False)
        m.weights.close()
        return m.eos_token_ids

    # Qwen2.5-Instruct's layout: config.json names <|im_end|>, generation_config.json adds
    # <|endoftext|>; generation stops at both, and show says so (and what config.json says)
    assert stops(tiny_chat_dir) == (258, 256)
    assert eos_line(tiny_chat_dir) == (
        "eos ids      258, 256 (generation stops at these); config.json's eos_token_id: 258")
    # the tokenizer's eos token joins generation_config.json's: show reads the same definition
    d = tmp_path / "m"
    shutil.copytree(tiny_chat_dir, d)
    g = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**g, "eos_token_id": 256}))
    assert stops(d) == (256, 258)
    assert eos_line(d).startswith("eos ids      256, 258 (generation stops at these)")


def test_every_option_states_its_default():
    import argparse

    from ignis.api.cli import CTX_HELP, build_parser
    from ignis.runtime.engine import DEFAULT_MAX_CTX
    assert f"capped at {DEFAULT_MAX_CTX}" in CTX_HELP
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        for a in p._actions:
            if not a.option_strings or a.nargs == 0:        # positionals; flags off unless given
                continue
            assert "default" in (a.help or ""), f"ignis {name} {a.option_strings[0]}: {a.help!r}"
    run = sub.choices["run"].format_help()
    assert "until an end-of-sequence token or the end of the context" in " ".join(run.split())


def test_inspect_plot_legend_is_outside_the_axes(tiny_qwen2_dir, tmp_path, monkeypatch, capsys):
    import pytest
    matplotlib = pytest.importorskip("matplotlib", reason="matplotlib (optional extra) not installed")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", figures.append)
    out = tmp_path / "plan.png"
    assert main(["inspect", str(tiny_qwen2_dir), "-q", "--tokens", "4", "--context", "64",
                 "--plot", str(out)]) == 0
    assert out.stat().st_size > 0 and len(figures) == 1
    fig = figures[0]
    try:
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent(renderer)
        assert legend.x0 >= ax.get_window_extent(renderer).x1        # right of the data, not on it
    finally:
        close(fig)


def test_run_checks_the_sampling_flags_before_loading_the_model(tiny_chat_dir, monkeypatch, capsys):
    loads = []
    monkeypatch.setattr("ignis.api.load.load", lambda *a, **k: loads.append(a))
    for flags, words in ((["--temperature", "5"], "--temperature must be a number in [0, 2]"),
                         (["--top-p", "0"], "--top-p must be"), (["--stop", ""], "--stop strings"),
                         (["--max-tokens", "0"], "--max-tokens must be an integer >= 1")):
        for command in ("run", "chat"):
            argv = [command, str(tiny_chat_dir), *(["hi"] if command == "run" else []), "-q", *flags]
            assert main(argv) == 1
            assert words in capsys.readouterr().err, (command, flags)
    assert loads == []
