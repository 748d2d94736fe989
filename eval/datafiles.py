"""Reading the benchmark files a user has: JSONL, Parquet or CSV, as rows of {column: value}.

The format follows the file's extension (.jsonl / .json / .parquet / .csv; .csv.gz is read through gzip). Column names are matched without regard to case (HuggingFaceH4/aime_2024 has
`problem` / `answer`, Maxwell-Jia/AIME_2024 `Problem` / `Answer`): `columns()` maps the names a driver
asks for onto the file's own spelling and raises DataError naming the file, the missing columns and
the ones it has. Parquet needs pyarrow (an optional extra: eval/requirements.txt); a missing pyarrow is
a DataError that names that file.
"""
import csv
import gzip
import io
import json
import os

import evalutil

REQUIREMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "requirements.txt")


class DataError(evalutil.TaskError):
    """A dataset file that cannot be used; the message names the file (and line or column)."""


def _open_text(path):
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8", newline="")
    return open(path, encoding="utf-8", newline="")


def _kind(path):
    base = path[:-3] if path.endswith(".gz") else path
    ext = os.path.splitext(base)[1].lower()
    if ext in (".jsonl", ".json", ".ndjson") and not path.endswith(".gz"):
        return "jsonl"
    if ext in (".parquet", ".pq"):
        return "parquet"
    if ext in (".csv", ".tsv"):
        return ext[1:]
    raise DataError(f"{path}: unknown file type {ext or '(no extension)'!r} (expected .jsonl, .parquet or .csv)")


def _read_jsonl(path):
    if path.endswith(".json"):  # a JSON array of objects (or JSON Lines under a .json name)
        with _open_text(path) as f:
            text = f.read()
        if text.lstrip().startswith("["):
            try:
                data = json.loads(text)
            except ValueError as e:
                raise DataError(f"{path}: not JSON: {e}") from None
            if not all(isinstance(r, dict) for r in data):
                raise DataError(f"{path}: the JSON array must hold objects")
            return data
    try:
        return [obj for _, obj in evalutil.read_jsonl(path)]
    except evalutil.TaskError as e:
        raise DataError(str(e)) from None


def _read_csv(path, delimiter):
    with _open_text(path) as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        if reader.fieldnames is None:
            return []
        rows = []
        for row in reader:
            if None in row:
                raise DataError(f"{path}:{reader.line_num}: more fields than the header has")
            rows.append(row)
        return rows


def _read_parquet(path):
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install -r {REQUIREMENTS}") from None
    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None


def read_rows(path):
    """All rows of the file as dicts (column -> value); DataError for a missing, empty or bad file."""
    if not path:
        raise DataError("no dataset file given (--data FILE or EVAL_DATA)")
    kind = _kind(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    try:
        if kind == "jsonl":
            rows = _read_jsonl(path)
        elif kind == "parquet":
            rows = _read_parquet(path)
        else:
            rows = _read_csv(path, "\t" if kind == "tsv" else ",")
    except OSError as e:
        raise DataError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e})") from None
    except csv.Error as e:
        raise DataError(f"{path}: bad CSV: {e}") from None
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def columns(path, rows, wanted, optional=()):
    """{wanted name: the file's spelling} matched case-insensitively (spaces and underscores alike);
    DataError naming the missing ones and the columns the file has."""
    have = {}
    for r in rows[:1] if rows else []:
        for k in r:
            have.setdefault(_norm(k), k)
    out, missing = {}, []
    for name in list(wanted) + list(optional):
        key = have.get(_norm(name))
        if key is None:
            if name in wanted:
                missing.append(name)
            continue
        out[name] = key
    if missing:
        raise DataError(f"{path}: missing column(s) {', '.join(missing)} (matched without regard to case); "
                        f"the file has: {', '.join(map(str, rows[0].keys()))}")
    return out


def _norm(name):
    return str(name).strip().lower().replace("_", " ")
