"""Debezium's column options (``events.column_rules``): which columns they match, what they make of values
(Debezium's own expectations, and Java itself for how it serializes a string), and the events they give."""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cassandra_cdc.events.column_rules import ColumnRuleError, ColumnRules, HashMask
from cassandra_cdc.events.event_encoder import EventEncoder, Source
from cassandra_cdc.localcluster.artifacts import java_executable
from cassandra_cdc.pipeline.pipeline_config import load_config
from cassandra_cdc.schema import parse_schema
from cassandra_cdc.settings import ConfigError

SCHEMA = parse_schema("""CREATE TABLE app.people (id text PRIMARY KEY, "Email" text, ssn text, bio varchar,
    phone ascii, age int, notes text) WITH ID = 7d0e7a10-0000-4000-8000-0000000000c1 AND cdc = true;""")
PEOPLE = SCHEMA.table("app", "people")
SOURCE = Source("prod", "prod", "app", "people", 1_700_000_000_000_000, False, "node1", 1, 2)


@pytest.mark.parametrize("version, algorithm, expected", [
    # Debezium's MaskStringsTest: the salt "salt", the values "hello" and "world".
    (1, "SHA-256", ("af5843a0f0e728ab0332c8888b6e1190bfb79e584f0d40538de8f10df6ef29c6",
                    "4588e1f2dcdc7fefc1515d3acd5acb9033478eace68286f383c337b9ff4464a3")),
    (1, "MD5", ("46f48a7a5ea32efba87cbff49d46d35a", "030f632140d9c9591b0d8c21098024b8")),
    (2, "SHA-256", ("cd31b3b98ece60cb739c0bf770b2de892ae0ad133f645513c3d83f08757a843a",
                    "e84ac3142870113ddc6710c06f76421befc8e8ca6de64e98d2993ed8d41f4085")),
    (2, "md5", ("06decc8b095724f80103712c235586be", "172c8e95398cc72ab5358ead6981e7e5")),
])
def test_hashes_are_debeziums(version: int, algorithm: str, expected: tuple[str, str]) -> None:
    hashed = HashMask(algorithm, "salt", (".*",), version).rewrite()  # type: ignore[arg-type]
    assert (hashed("hello"), hashed("world"), hashed(None)) == (*expected, None)


# Java's String serialization differs from UTF-8 for NUL, characters beyond the BMP (two 3-byte units) and
# strings of over 65,535 bytes (another type code and length).
JAVA_HASHES = """
import java.io.*;
import java.security.MessageDigest;
import java.util.Base64;

public class Hashes {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        for (String line; (line = in.readLine()) != null; ) {
            String[] parts = line.split(" ", -1);
            MessageDigest digest = MessageDigest.getInstance(parts[0]);
            digest.update(Base64.getDecoder().decode(parts[1]));
            ByteArrayOutputStream bytes = new ByteArrayOutputStream();
            try (ObjectOutputStream out = new ObjectOutputStream(bytes)) {
                out.writeObject(new String(Base64.getDecoder().decode(parts[2]), "UTF-8"));
            }
            StringBuilder hex = new StringBuilder();
            for (byte b : digest.digest(bytes.toByteArray())) hex.append(String.format("%02x", b));
            System.out.println(hex);
        }
    }
}
"""
VALUES = ["", "a", "nul\0inside", "é ü ß", "€ 漢字", "emoji 🎉 and 𝄞",
          "quote \" back\\slash => ,{}", "x" * 70_000, "é" * 40_000]


def test_version_1_hashes_the_string_as_java_serializes_it(tmp_path: Path) -> None:
    source = tmp_path / "Hashes.java"
    source.write_text(JAVA_HASHES)
    cases = [(algorithm, salt, value) for algorithm in ("SHA-256", "SHA-512", "MD5", "SHA3-256")
             for salt in ("salt", "sel ü") for value in VALUES]
    lines = "".join(f"{a} {_base64(s)} {_base64(v)}\n" for a, s, v in cases)
    java = subprocess.run([java_executable(), str(source)], input=lines, capture_output=True, text=True,
                          check=True, timeout=120)
    ours = [HashMask(a, s, (".*",)).rewrite()(v) for a, s, v in cases]
    assert ours == java.stdout.split()


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def event(rules: ColumnRules, before: dict[str, Any] | None, after: dict[str, Any] | None,
          op: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The key and value documents of an event of app.people under ``rules``."""
    encoder = EventEncoder("prod", PEOPLE, columns=rules)
    row = after if after is not None else before
    return (json.loads(encoder.key(row)),  # type: ignore[arg-type]
            json.loads(encoder.value(before, after, op, SOURCE, 1)))  # type: ignore[arg-type]


ROW = {"id": "hello", "Email": "ann@example.com", "ssn": "078-05-1120", "bio": "abcdefgh", "phone": "world",
       "age": 30, "notes": None}


def test_rules_leave_columns_out_and_rewrite_values_key_included() -> None:
    rules = ColumnRules(exclude=(r"APP\.people\.(ssn|age)",), truncate=((3, (r"app\.people\.bio",)),),
                        mask=((4, (r"app\.people\.email", r"app\.people\.notes")),),
                        hashes=(HashMask("SHA-256", "salt", (r"app\.people\.(phone|id)",), 2),))
    key, value = event(rules, None, ROW, "c")
    hello, world = ("cd31b3b98ece60cb739c0bf770b2de892ae0ad133f645513c3d83f08757a843a",
                    "e84ac3142870113ddc6710c06f76421befc8e8ca6de64e98d2993ed8d41f4085")
    assert key["payload"] == {"id": hello}
    # Matched whole and case-insensitively (APP, email); a mask replaces a null too, a hash does not.
    assert value["payload"]["after"] == {"id": hello, "Email": "****", "bio": "abc", "phone": world,
                                         "notes": "****"}
    row_schema = value["schema"]["fields"][1]
    assert [f["field"] for f in row_schema["fields"]] == ["id", "Email", "bio", "notes", "phone"]
    assert [f["type"] for f in row_schema["fields"]] == ["string"] * 5
    _, deleted = event(rules, {**ROW, "phone": None, "bio": "ab"}, None, "d")
    assert deleted["payload"]["before"] == {"id": hello, "Email": "****", "bio": "ab", "phone": None,
                                            "notes": "****"}
    assert deleted["payload"]["after"] is None


def test_an_excluded_primary_key_column_stays_in_the_key_and_a_partial_match_matches_nothing() -> None:
    rules = ColumnRules(exclude=(r"app\.people\.id", r"people\.ssn", "app.people.ag"))
    key, value = event(rules, None, ROW, "c")
    assert key["payload"] == {"id": "hello"}
    assert value["payload"]["after"] == {k: v for k, v in ROW.items() if k != "id"}


def test_the_first_rule_of_truncation_mask_hash_applies() -> None:
    everything = (r"app\.people\.bio",)
    both_hashes = (HashMask("MD5", "salt", everything, 2), HashMask("MD5", "salt", everything, 1))
    rules = ColumnRules(truncate=((2, everything),), mask=((4, everything),), hashes=both_hashes)
    assert event(rules, None, ROW, "c")[1]["payload"]["after"]["bio"] == "ab"
    rules = ColumnRules(mask=((4, everything),), hashes=(HashMask("MD5", "salt", everything, 2),))
    assert event(rules, None, ROW, "c")[1]["payload"]["after"]["bio"] == "****"
    rules = ColumnRules(hashes=both_hashes)
    assert event(rules, None, {**ROW, "bio": "hello"}, "c")[1]["payload"]["after"]["bio"] == (
        "46f48a7a5ea32efba87cbff49d46d35a")  # version 1's (Debezium's MaskStringsTest)


def test_a_rule_matching_a_column_that_is_not_text_is_refused() -> None:
    refused = r"app\.people\.age is a int column: .* text, varchar and ascii"
    with pytest.raises(ColumnRuleError, match=refused):
        EventEncoder("prod", PEOPLE, columns=ColumnRules(mask=((4, (r"app\.people\..*",)),)))
    # Excluding it is the way to keep it out.
    EventEncoder("prod", PEOPLE, columns=ColumnRules(exclude=(r"app\.people\.age",),
                                                     mask=((4, (r"app\.people\.(?!age).*",)),)))


def test_the_rules_from_the_configuration(tmp_path: Path) -> None:
    salt_file = tmp_path / "salt"
    salt_file.write_text("s3cret\n")
    config = tmp_path / "pipeline.yaml"
    config.write_text(rf"""server: prod
checkpoint: /tmp/x
kafka: {{bootstrap_servers: "k:9092"}}
output:
  skipped_operations: u,t
  column_exclude_list: app\.people\.ssn, app\.people\.age
  column_truncate_to_chars: {{3: [app\.people\.bio]}}
  column_mask_with_chars: {{0: app\.people\.notes}}
  column_mask_hash:
    - {{algorithm: SHA-256, salt_file: {salt_file}, version: 2, columns: [app\.people\.phone]}}
""")
    output = load_config(config).output
    assert output.skipped_operations == ("u", "t")
    assert output.column_rules == ColumnRules(
        exclude=(r"app\.people\.ssn", r"app\.people\.age"), truncate=((3, (r"app\.people\.bio",)),),
        mask=((0, (r"app\.people\.notes",)),),
        hashes=(HashMask("SHA-256", "s3cret", (r"app\.people\.phone",), 2),))
    assert load_config(config, {"output.skipped_operations": "none"}).output.skipped_operations == ()


@pytest.mark.parametrize("setting, value, problem", [
    ("column_exclude_list", "app.(people", r"output\.column_exclude_list: 'app\.\(people' is not a regular "
                                           r"expression: missing \), unterminated subpattern"),
    ("skipped_operations", "c,x", r"output\.skipped_operations\.1: Input should be 'c', 'u', 'd' or 't'"),
    ("column_mask_with_chars", {-1: "a.b.c"}, r"output\.column_mask_with_chars: a length of characters is 0 "
                                              r"or more, not -1"),
    ("column_mask_hash", [{"algorithm": "SHA-257", "salt": "s", "columns": "a.b.c"}],
     r"output\.column_mask_hash\.0\.algorithm: unknown hash algorithm 'SHA-257': one of MD5, SHA, SHA-1"),
])
def test_a_bad_rule_is_refused_naming_its_key(setting: str, value: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(None, {"server": "prod", "checkpoint": "/tmp/x", "kafka.bootstrap_servers": "k:9092",
                           f"output.{setting}": value})
