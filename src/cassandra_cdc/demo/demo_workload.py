"""What the demo cluster holds and writes: the schema, its one schema change, and the workload settings.

Four tables in one keyspace, as an application might have them:

- ``shop.orders``: order lines, with a static column (the order's note), a set, a map and a list, and
  TTL'd writes; every kind of statement the workload knows runs on it;
- ``shop.page_views``: counters;
- ``shop.users``: a plain table, which gains a column (``country``) halfway through the demo;
- ``shop.audit``: a table *without* ``cdc = true``: the nodes write it to their commit logs like any other,
  and no event must ever come out of it.
"""

from __future__ import annotations

SERVER = "demo"
KEYSPACE = "shop"

SCHEMA_CQL = """\
-- What `cqlsh -e 'DESCRIBE SCHEMA'` prints for the demo cluster (the agents read this file).
CREATE KEYSPACE shop WITH replication = {'class': 'SimpleStrategy', 'replication_factor': '3'};

CREATE TABLE shop.orders (
    id int,
    line int,
    item text,
    qty int,
    price double,
    paid boolean,
    note text static,
    tags set<text>,
    attrs map<text, int>,
    history list<int>,
    PRIMARY KEY (id, line)
) WITH ID = 5e1d0c3a-0000-4000-8000-000000000001 AND cdc = true;

CREATE TABLE shop.page_views (
    page text PRIMARY KEY,
    views counter,
    clicks counter
) WITH ID = 5e1d0c3a-0000-4000-8000-000000000002 AND cdc = true;

CREATE TABLE shop.users (
    id int PRIMARY KEY,
    name text,
    email text,
    plan text
) WITH ID = 5e1d0c3a-0000-4000-8000-000000000003 AND cdc = true;

CREATE TABLE shop.audit (
    id int PRIMARY KEY,
    what text,
    who text
) WITH ID = 5e1d0c3a-0000-4000-8000-000000000004;
"""

# The schema change of the demo, and what it changes.
ALTER_CQL = "ALTER TABLE shop.users ADD country text;\n"
ALTERED_TABLE = "shop.users"
ADDED_COLUMN = "country"

CDC_TABLES = ("shop.orders", "shop.page_views", "shop.users")
NON_CDC_TABLE = "shop.audit"
TABLES = CDC_TABLES + (NON_CDC_TABLE,)
