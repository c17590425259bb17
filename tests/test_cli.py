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
    for cmd in ("pull", "list", "show", "inspect", "models", "bench", "cpu", "run", "chat"):
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
    assert main(["inspect", str(tiny_qwen2_dir), "-q", "--tokens", "8", "--context", "4"]) == 1
    assert "--context (4) must be >= --tokens (8)" in capsys.readouterr().err


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
