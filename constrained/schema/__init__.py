"""JSON-Schema intake: what happens to a schema before a grammar backend compiles it.

    check.py     refuse what is not a usable schema (typed errors naming the path)
    walk.py      where the subschemas are (`iter_subschemas`, `scan_keywords`, `strip_keywords`)
    refs.py      local `$ref` pointers: resolve, rebase, hoist into `$defs`
    patterns.py  regexes: search semantics to full match, what backends cannot enforce
    widen.py     type-specific keywords on untyped subschemas (xgrammar's narrower reading)
    prepare.py   the one path every JSON-producing spec takes (`json_parts`)
    dispatch.py  constraints the converters drop without a word (one handler per object)
"""
