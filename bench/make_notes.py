#!/usr/bin/env python3
"""make_notes.py - memory note sets for `agentkv bench reuse --notes`, made
from held-out text with deterministic metadata. Python standard library only.

    python3 bench/make_notes.py --shape amem --out build/notes/amem.jsonl \
        ../shared/golden/tiny-llama-h64/val.txt ../shared/golden/stories260K/story.txt
    python3 bench/make_notes.py --shape locomo --out build/notes/locomo.jsonl ...

Nothing here is tuned by hand: the same inputs, shape and seed give the same
file byte for byte. Generated files belong in build directories, not in the
repository.

Steps (docs/reuse-notes.md has the rationale):

1. Documents. Each input is cut into paragraphs at blank lines (a file with
   no blank line: one paragraph a line). A new document starts at a title (a
   paragraph of one unindented line of at most 12 words, not ending in
   . : , or ;) that follows a code or example block (a paragraph with most
   lines indented): the kernel, Python and PostgreSQL documents of the
   held-out text end with examples. Where that misses a boundary two
   documents count as one, which only makes "different documents" stricter.
2. Note contents. Prose paragraphs (at least 12 words, at least 60% letters,
   not a list item, not code), whitespace folded, in order; a paragraph under
   --min-words is joined with the next prose paragraph of the same document;
   one over --max-words is cut at its last sentence end within the limit (at
   the limit when there is none past --min-words). Each content keeps the
   prose that follows it in its document (for the queries).
3. Metadata, deterministic:
   keywords  the --keywords words of the content with the highest tf-idf
             (idf over all contents; words of 3+ letters, stopwords out;
             ties: alphabetical);
   tags      the 3 words of the content's document with the highest tf-idf
             (idf over documents): a topic label shared by its notes;
   context   a one-line summary: the content's first sentence, cut to 16
             words;
   links     up to 3 other notes sharing the most keywords (at least one;
             ties: the lower index);
   time      a date and time that advances with the note's index.
4. Shapes. amem (A-MEM's retrieved-note fields, one per line):
       talk start time: 2023-01-02 09:00
       memory content: ...
       memory context: ...
       memory keywords: k1, k2, ...
       memory tags: t1, t2, t3
       memory links: n0012, n0040
   locomo (a LoCoMo conversation session: a date, then speaker turns; the
   content's sentences become the turns, 1 sentence per turn, 2 when the
   first is under 12 words, two speakers of a fixed name list alternating,
   a pair per document):
       DATE: 1:56 pm on 8 May, 2023
       CONVERSATION:
       Caroline said, "..."
       Melanie said, "..."
5. Queries. --queries of them; each names --per-query notes from as many
   different documents: a target (a note whose following prose has at least
   30 words, drawn with the seed) and the notes of other documents that
   share the most keywords with it (a retriever's choice; ties broken by a
   seeded shuffle; at most one note a document). Its text is
       Question: What do the memories say about K1 and K2?
       Answer: <the target's following prose, up to 120 words>
   (K1, K2: the target's first two keywords; locomo: "What did A and B say
   about K1 and K2?"). The bench permutes each query's notes itself.

Output: JSON lines. The first is {"type": "meta", ...} (inputs, shape, seed,
counts); then {"type": "note", "id", "doc", "text", "content", "keywords",
"tags", "context", "links", "time"} per note and {"type": "query", "id",
"notes", "text"} per query. The bench reads "type", "id", "text" and
"notes" and ignores the rest.
"""
import argparse
import datetime
import json
import math
import random
import re
import sys

STOPWORDS = set("""
a about above after again against all also am an and any are as at be because been before being below between
both but by can could did do does doing down during each else few for from further had has have having he her
here hers herself him himself his how however i if in into is it its itself just let may me might more most
must my myself no nor not now of off on once one only or other our ours ourselves out over own same shall she
should so some such than that the their theirs them themselves then there these they this those through thus
to too two under until up upon us use used uses using very via was we were what when where which while who whom
why will with within without would yes yet you your yours yourself yourselves see also may following example
""".split())

NAMES = [("Caroline", "Melanie"), ("Joanna", "Nate"), ("Audrey", "Andrew"), ("Jolene", "Deborah"),
         ("John", "Maria"), ("Tim", "John"), ("Evan", "Sam"), ("Calvin", "Dave"), ("Gina", "Jon"),
         ("James", "Jasmine")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def paragraphs(text):
    """Paragraphs of a text: split at blank lines, or a line each when
    there is no blank line."""
    if not re.search(r"\n[ \t]*\n", text):
        return [line for line in text.split("\n") if line.strip()]
    return [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def is_code(p):
    """Most of the paragraph's lines indented: code, an example, a diagram."""
    lines = [ln for ln in p.split("\n") if ln.strip()]
    return sum(1 for ln in lines if ln[:1] in " \t") * 2 > len(lines)


def is_title(p):
    lines = [ln for ln in p.split("\n") if ln.strip()]
    return (len(lines) == 1 and lines[0][:1] not in " \t-*" and len(lines[0].split()) <= 12
            and not re.search(r"[.:,;]$", lines[0].strip()))


def is_prose(p):
    words = p.split()
    if len(words) < 12 or is_code(p) or p.lstrip()[:1] in "-*|+#":
        return False
    letters = sum(1 for ch in p if ch.isalpha())
    return letters >= 0.6 * len(p.replace(" ", "").replace("\n", ""))


def documents(text):
    """The documents of one input: lists of paragraphs (step 1)."""
    docs, cur, prev_code = [], [], True
    for p in paragraphs(text):
        if is_title(p) and prev_code and cur:
            docs.append(cur)
            cur = []
        cur.append(p)
        prev_code = is_code(p)
    if cur:
        docs.append(cur)
    return docs


def fold(s):
    return " ".join(s.split())


def sentences(s):
    """Sentences of folded text: cut after . ! ? followed by a space and an
    upper-case letter, a digit or a quote."""
    return [x for x in re.split(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])", s) if x]


def cut_words(s, max_words, min_words):
    """s cut to at most max_words words: at the last sentence end within the
    limit when that keeps at least min_words, else at the limit."""
    words = s.split()
    if len(words) <= max_words:
        return s
    out, n = [], 0
    for sent in sentences(s):
        k = len(sent.split())
        if n + k > max_words:
            break
        out.append(sent)
        n += k
    if n >= min_words:
        return " ".join(out)
    return " ".join(words[:max_words])


def contents(doc, min_words, max_words):
    """Note contents of one document with the prose after each (step 2)."""
    prose = [fold(p) for p in doc if is_prose(p)]
    out, i = [], 0
    while i < len(prose):
        c = prose[i]
        i += 1
        while len(c.split()) < min_words and i < len(prose):
            c += " " + prose[i]
            i += 1
        c = cut_words(c, max_words, min_words)
        out.append((c, " ".join(prose[i:])))
    return out


def words_of(s):
    return [w for w in re.findall(r"[a-z][a-z0-9_]+", s.lower()) if len(w) >= 3 and w not in STOPWORDS]


def top_tfidf(counts, df, n_docs, k):
    """The k words of counts (word -> tf) with the highest tf * idf; ties
    alphabetical."""
    scored = [(-c * math.log(n_docs / df[w]), w) for w, c in counts.items()]
    return [w for _, w in sorted(scored)[:k]]


def count(ws):
    c = {}
    for w in ws:
        c[w] = c.get(w, 0) + 1
    return c


def note_time(i):
    return datetime.datetime(2023, 1, 2, 9, 0) + datetime.timedelta(days=i, minutes=37 * i)


def session_date(i):
    t = note_time(i)
    h = t.hour % 12 or 12
    return "%d:%02d %s on %d %s, %d" % (h, t.minute, "am" if t.hour < 12 else "pm", t.day, MONTHS[t.month - 1],
                                        t.year)


def render_amem(n):
    return ("talk start time: %s\nmemory content: %s\nmemory context: %s\nmemory keywords: %s\n"
            "memory tags: %s\nmemory links: %s" % (n["time"], n["content"], n["context"], ", ".join(n["keywords"]),
                                                   ", ".join(n["tags"]), ", ".join(n["links"]) or "none"))


def render_locomo(n, i):
    a, b = NAMES[n["doc"] % len(NAMES)]
    turns, cur = [], []
    for s in sentences(n["content"]):
        cur.append(s)
        if len(cur) == 2 or len(s.split()) >= 12:
            turns.append(" ".join(cur))
            cur = []
    if cur:
        turns.append(" ".join(cur))
    lines = ["DATE: " + session_date(i), "CONVERSATION:"]
    for t, turn in enumerate(turns):
        lines.append('%s said, "%s"' % (a if t % 2 == 0 else b, turn.replace('"', "'")))
    return "\n".join(lines)


def build(inputs, shape, n_queries, per_query, seed, min_words, max_words, n_keywords):
    docs = []
    for path in inputs:
        with open(path, encoding="utf-8") as f:
            docs.extend(documents(f.read()))
    notes = []
    for d, doc in enumerate(docs):
        for c, follow in contents(doc, min_words, max_words):
            notes.append({"doc": d, "content": c, "follow": follow})
    # keywords: tf-idf over the contents
    wc = [count(words_of(n["content"])) for n in notes]
    df = {}
    for c in wc:
        for w in c:
            df[w] = df.get(w, 0) + 1
    for n, c in zip(notes, wc):
        n["keywords"] = top_tfidf(c, df, len(notes), n_keywords)
    # tags: tf-idf of the document's prose over the documents
    dwc = [count(words_of(" ".join(p for p in doc if is_prose(p)))) for doc in docs]
    ddf = {}
    for c in dwc:
        for w in c:
            ddf[w] = ddf.get(w, 0) + 1
    dtags = [top_tfidf(c, ddf, len(docs), 3) for c in dwc]
    for i, n in enumerate(notes):
        n["id"] = "n%04d" % i
        n["tags"] = dtags[n["doc"]]
        n["context"] = " ".join(sentences(n["content"])[0].split()[:16]) if n["content"] else ""
        n["time"] = note_time(i).strftime("%Y-%m-%d %H:%M")
    for i, n in enumerate(notes):
        kw = set(n["keywords"])
        shared = [(-len(kw & set(m["keywords"])), j) for j, m in enumerate(notes) if j != i]
        n["links"] = [notes[j]["id"] for s, j in sorted(shared)[:3] if s < 0]
    for i, n in enumerate(notes):
        n["text"] = render_amem(n) if shape == "amem" else render_locomo(n, i)
    # queries
    rng = random.Random(seed)
    targets = [i for i, n in enumerate(notes) if len(n["follow"].split()) >= 30]
    n_docs_with_notes = len(set(n["doc"] for n in notes))
    if n_docs_with_notes < per_query:
        sys.exit("make_notes: %d documents hold notes, fewer than --per-query %d" % (n_docs_with_notes, per_query))
    order = targets[:]
    rng.shuffle(order)
    queries = []
    for q in range(min(n_queries, len(order))):
        t = order[q]
        tn = notes[t]
        kw = set(tn["keywords"])
        others = [j for j in range(len(notes)) if notes[j]["doc"] != tn["doc"]]
        rng.shuffle(others)
        others.sort(key=lambda j: -len(kw & set(notes[j]["keywords"])))   # stable: the shuffle breaks ties
        picked, seen = [t], {tn["doc"]}
        for j in others:
            if len(picked) == per_query:
                break
            if notes[j]["doc"] not in seen:
                picked.append(j)
                seen.add(notes[j]["doc"])
        k1, k2 = (tn["keywords"] + ["it", "it"])[:2]
        if shape == "amem":
            question = "What do the memories say about %s and %s?" % (k1, k2)
        else:
            a, b = NAMES[tn["doc"] % len(NAMES)]
            question = "What did %s and %s say about %s and %s?" % (a, b, k1, k2)
        answer = " ".join(tn["follow"].split()[:120])
        queries.append({"type": "query", "id": "q%04d" % q, "notes": [notes[j]["id"] for j in picked],
                        "text": "Question: %s\nAnswer: %s" % (question, answer)})
    return docs, notes, queries


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("inputs", nargs="+", help="held-out text files")
    ap.add_argument("--shape", choices=["amem", "locomo"], required=True)
    ap.add_argument("--out", required=True, help="the JSONL file to write ('-': stdout)")
    ap.add_argument("--queries", type=int, default=32)
    ap.add_argument("--per-query", type=int, default=4, help="notes a query names (from as many documents)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--min-words", type=int, default=20)
    ap.add_argument("--max-words", type=int, default=60)
    ap.add_argument("--keywords", type=int, default=5)
    a = ap.parse_args()
    docs, notes, queries = build(a.inputs, a.shape, a.queries, a.per_query, a.seed, a.min_words, a.max_words,
                                 a.keywords)
    out = sys.stdout if a.out == "-" else open(a.out, "w", encoding="utf-8")
    meta = {"type": "meta", "generator": "bench/make_notes.py", "shape": a.shape, "inputs": a.inputs,
            "seed": a.seed, "documents": len(docs), "documents_with_notes": len(set(n["doc"] for n in notes)),
            "notes": len(notes), "queries": len(queries), "per_query": a.per_query, "min_words": a.min_words,
            "max_words": a.max_words, "keywords": a.keywords}
    out.write(json.dumps(meta) + "\n")
    for n in notes:
        rec = {"type": "note", "id": n["id"], "doc": n["doc"], "text": n["text"], "content": n["content"],
               "keywords": n["keywords"], "tags": n["tags"], "context": n["context"], "links": n["links"],
               "time": n["time"]}
        out.write(json.dumps(rec) + "\n")
    for q in queries:
        out.write(json.dumps(q) + "\n")
    if out is not sys.stdout:
        out.close()
    print("make_notes: %s: %d documents (%d with notes), %d notes, %d queries" %
          (a.out, len(docs), meta["documents_with_notes"], len(notes), len(queries)), file=sys.stderr)


if __name__ == "__main__":
    main()
