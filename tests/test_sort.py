"""``spamnb sort``: what the folders it files into look like, and what its help says it does."""

from __future__ import annotations

import os
import stat

from click.testing import CliRunner

from spamnb.cli import main
from spamnb.delivery.maildir_sort import move


def run(args, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result


def test_sort_makes_maildir_plus_plus_folders_with_the_marker(trained_model_file, sample_maildir):
    """Maildir++: every sub-folder holds an empty file ``maildirfolder`` (Courier's
    ``maildirmake -f`` makes one; Courier IMAP and Dovecot's maildir++ layout
    read it), and the inbox itself holds none."""
    run(["sort", sample_maildir, "--model", trained_model_file, "--unsure-folder", ".Unsure",
         "--ham-cutoff", "0.01", "--spam-cutoff", "0.99"])
    for folder in (".Junk", ".Unsure"):
        marker = sample_maildir / folder / "maildirfolder"
        assert marker.is_file(), folder
        st = marker.stat()
        assert st.st_size == 0 and stat.S_IMODE(st.st_mode) == 0o600
        assert list((sample_maildir / folder / "cur").iterdir())  # something was filed there
    assert not (sample_maildir / "maildirfolder").exists()


def test_sort_adds_the_marker_to_a_folder_made_without_it(trained_model_file, sample_maildir):
    """A folder made by hand (`mkdir -p ~/Maildir/.Junk/{cur,new,tmp}`) or by procmail,
    which makes a missing maildir without the marker, gets it when sort files into it."""
    for sub in ("cur", "new", "tmp"):
        (sample_maildir / ".Junk" / sub).mkdir(parents=True)
    run(["sort", sample_maildir, "--model", trained_model_file])
    assert (sample_maildir / ".Junk" / "maildirfolder").is_file()


def test_move_keeps_an_existing_marker(tmp_path):
    """An existing marker (say with a mail server's mode) is left as it is."""
    root = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (root / sub).mkdir(parents=True)
        (root / ".Junk" / sub).mkdir(parents=True)
    marker = root / ".Junk" / "maildirfolder"
    marker.write_bytes(b"")
    marker.chmod(0o644)
    (root / "new" / "1.M1.host").write_bytes(b"Subject: x\n\nbody\n")
    assert move(str(root / "new" / "1.M1.host"), str(root / ".Junk" / "new" / "1.M1.host"))
    assert stat.S_IMODE(marker.stat().st_mode) == 0o644
    assert os.listdir(root / ".Junk" / "new") == ["1.M1.host"]


def test_sort_help_says_how_it_moves():
    """A move is a hard link and then an unlink (never a rename, which would overwrite)."""
    text = " ".join(run(["sort", "--help"]).output.split())
    assert "hard link" in text and "unlink" in text
    assert "rename" not in text
