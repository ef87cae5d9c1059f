"""scripts/download_multi30k.py on a small fake copy of the dataset (never the real corpus):
the addresses, gzipped downloads through file:// URLs, --from, alignment checks."""

from __future__ import annotations

import gzip
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "download_multi30k.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("download_multi30k", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_dataset(root: Path, dl: ModuleType, gzipped_raw: bool) -> dict[str, bytes]:
    """Three lines per file, each naming its file; raw/ gzipped as in the repository."""
    contents = {}
    for name in dl.files():
        text = "".join(f"{name} line {i}\n" for i in range(3)).encode("utf-8")
        contents[name] = text
        path = root / (dl.remote_name(name) if gzipped_raw else name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(text) if path.suffix == ".gz" else text)
    return contents


def test_addresses_follow_the_repository_layout():
    dl = load()
    urls = dl.urls()
    assert len(urls) == 12
    base = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/"
    assert base + "raw/train.en.gz" in urls and base + "raw/test_2016_flickr.de.gz" in urls
    assert base + "tok/val.lc.norm.tok.de" in urls
    assert base + "tok/test_2016_flickr.lc.norm.tok.en" in urls


def test_download_uncompresses_and_from_copies(tmp_path):
    dl = load()
    repo = tmp_path / "task1"
    contents = fake_dataset(repo, dl, gzipped_raw=True)
    fetched = tmp_path / "fetched"
    assert dl.main(["--base-url", repo.as_uri() + "/", "--out", str(fetched)]) == 0
    local = tmp_path / "local"  # the layout of /work/shared/corpora/multi30k: plain files
    fake_dataset(local, dl, gzipped_raw=False)
    for source, out in ((repo, tmp_path / "from_gz"), (local, tmp_path / "from_plain")):
        assert dl.main(["--from", str(source), "--out", str(out)]) == 0
    for out in (fetched, tmp_path / "from_gz", tmp_path / "from_plain"):
        for name, text in contents.items():
            assert (out / name).read_bytes() == text, (out, name)
        leftovers = [p for p in out.rglob("*") if p.is_file() and p.name.endswith(".part")]
        assert not leftovers


def test_missing_or_misaligned_files_fail(tmp_path, capsys):
    dl = load()
    local = tmp_path / "local"
    fake_dataset(local, dl, gzipped_raw=False)
    with open(local / "tok" / "val.lc.norm.tok.de", "a", encoding="utf-8") as f:
        f.write("one line too many\n")
    assert dl.main(["--from", str(local), "--out", str(tmp_path / "a")]) == 1
    assert "split val is not line-aligned" in capsys.readouterr().err
    (local / "raw" / "train.de").unlink()
    assert dl.main(["--from", str(local), "--out", str(tmp_path / "b")]) == 1
    assert "missing raw/train.de" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_an_address_that_does_not_answer_names_it_and_from(tmp_path, capsys):
    dl = load()
    nowhere = (tmp_path / "nowhere").as_uri() + "/"
    assert dl.main(["--out", str(tmp_path / "a"), "--base-url", nowhere]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: cannot download {dl.urls(nowhere)[0]} (")
    assert err[-1].endswith("without network, copy the files from a local folder with --from DIR")


def test_help_runs():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--from" in proc.stdout and "--out" in proc.stdout


def test_the_config_reads_what_the_script_writes():
    from nmt.config import load_config

    dl = load()
    cfg = load_config(ROOT / "configs" / "multi30k.yaml", require_data=False)
    written = {f"data/multi30k/{name}" for name in dl.files()}
    for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
        assert getattr(cfg.data, key) in written, key
    assert cfg.train.early_stopping_metric == "bleu" and cfg.train.label_smoothing == 0.1
