#!/usr/bin/env python3
"""Many sessions on one `aisql serve`, measured as a user sees them (psycopg).

1. `SELECT 1` in one session while an AI query runs in another: milliseconds.
2. Four sessions at once, each asking its own `ai_filter` question of the same
   documents, against the same four one after another: wall time, and the
   fresh tokens the server reports per statement (its NOTICE).
3. A second question over the same documents in the same server: fresh tokens
   and wall time against the first question's.

Each measurement starts a server of its own (`--keep-kv`, default on, keeps
documents' KV across statements; `--keep-kv off` is the baseline of every
statement paying for its documents).

usage: scripts/bench-sessions.py [--aisql PATH] [--docs N] [--words N]
       [--model tiny|DIR|FILE.gguf] [--dtype q8_0] [--python-threads]
psycopg must be importable (the test venv has it: scripts/test-tools.sh).
"""

import argparse
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psycopg

QUESTIONS = [
    "Is the review {0} positive?",
    "Does the review {0} mention the plot?",
    "Is the reviewer of {0} angry?",
    "Would the author of {0} watch it again?",
]
PASSWORD = "bench-sessions"


def statement(question):
    return f"SELECT count(*) FROM docs WHERE ai_filter('{question}', body)"


def write_docs(path, n, words):
    vocabulary = "good bad film plot great boring actor scene dull fun slow cast".split()
    rng = random.Random(54)
    with open(path, "w") as f:
        f.write("id,body\n")
        for i in range(n):
            body = " ".join(rng.choice(vocabulary) for _ in range(words))
            f.write(f"{i},review {i}: {body}\n")


class Server:
    def __init__(self, args, docs, extra):
        cmd = [args.aisql, "serve", "--table", f"docs={docs}", "--model", args.model,
               "--listen", "127.0.0.1:0", *extra]
        if args.dtype:
            cmd += ["--dtype", args.dtype]
        env = dict(os.environ, AISQL_PASSWORD=PASSWORD)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, env=env)
        for line in self.proc.stdout:
            m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        else:
            raise SystemExit(f"aisql serve did not start: {' '.join(cmd)}")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def connect(self):
        con = psycopg.connect(
            host="127.0.0.1", port=self.port, user="bench", dbname="bench",
            password=PASSWORD, autocommit=True)
        con.fresh = []
        con.add_notice_handler(lambda d: note_fresh(con, d.message_primary or ""))
        return con

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


def note_fresh(con, message):
    m = re.search(r"fresh tokens: (\d+)", message)
    if m:
        con.fresh.append(int(m.group(1)))


def timed(con, sql):
    started = time.monotonic()
    con.execute(sql).fetchall()
    return time.monotonic() - started


def plain_beside_ai(args, docs):
    server = Server(args, docs, [])
    try:
        ai, plain = server.connect(), server.connect()
        timed(plain, "SELECT 1")
        runner = threading.Thread(target=timed, args=(ai, statement(QUESTIONS[0])))
        runner.start()
        time.sleep(1.0)
        waits = []
        while runner.is_alive() and len(waits) < 20:
            waits.append(timed(plain, "SELECT 1") * 1000)
            time.sleep(0.05)
        runner.join()
        if not waits:
            print("1. the AI query ended before SELECT 1 could be asked: use more --docs")
            return
        print(f"1. SELECT 1 beside an AI query: median {statistics.median(waits):.1f} ms, "
              f"max {max(waits):.1f} ms ({len(waits)} statements)")
    finally:
        server.stop()


def one_after_another(args, docs, keep):
    server = Server(args, docs, ["--keep-kv", keep])
    try:
        con = server.connect()
        seconds = [timed(con, statement(q)) for q in QUESTIONS]
        return seconds, con.fresh
    finally:
        server.stop()


def at_once(args, docs):
    server = Server(args, docs, [])
    try:
        cons = [server.connect() for _ in QUESTIONS]
        ended = {}

        def run(i, con, question):
            timed(con, statement(question))
            ended[i] = time.monotonic()

        threads = [threading.Thread(target=run, args=(i, c, q))
                   for i, (c, q) in enumerate(zip(cons, QUESTIONS))]
        started = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        finished = ", ".join(f"{ended[i] - started:.2f}" for i in sorted(ended))
        print(f"   at once, each session's statement ended after (s): {finished}")
        return time.monotonic() - started, [f for c in cons for f in c.fresh]
    finally:
        server.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--aisql", default="target/debug/aisql")
    p.add_argument("--docs", type=int, default=3000)
    p.add_argument("--words", type=int, default=60)
    p.add_argument("--model", default="tiny")
    p.add_argument("--dtype")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        docs = os.path.join(tmp, "docs.csv")
        write_docs(docs, args.docs, args.words)
        print(f"{args.docs} documents of {args.words} words, model {args.model}"
              + (f" ({args.dtype})" if args.dtype else ""))
        plain_beside_ai(args, docs)
        alone_s, alone_fresh = one_after_another(args, docs, "off")
        kept_s, kept_fresh = one_after_another(args, docs, "on")
        together_s, together_fresh = at_once(args, docs)
        print("2. four questions: one after another without keeping KV "
              f"{sum(alone_s):.2f} s, fresh {sum(alone_fresh)}; keeping KV {sum(kept_s):.2f} s, "
              f"fresh {sum(kept_fresh)}; at once {together_s:.2f} s, fresh {sum(together_fresh)}")
        if alone_fresh:
            print(f"   at once / one alone: fresh {sum(together_fresh) / alone_fresh[0]:.2f}x; "
                  f"time at once / one after another (kept) {together_s / sum(kept_s):.2f}, "
                  f"(not kept) {together_s / sum(alone_s):.2f}")
        if len(kept_fresh) >= 2:
            print(f"3. second question: fresh {kept_fresh[1]} of the first's {kept_fresh[0]} "
                  f"({100 * kept_fresh[1] / kept_fresh[0]:.1f} %), time {kept_s[1]:.2f} s of "
                  f"{kept_s[0]:.2f} s ({kept_s[1] / kept_s[0]:.2f}x)")


if __name__ == "__main__":
    sys.exit(main())
