"""The code that reads and writes MongoDB: one module per group of collections (`accounts`,
`access_requests`, `leaderboard`, `jobs`, ...), each the only code that touches its collections
(tests/unit/test_stores.py holds every collection to its owner). Callers ask for named
transitions and look-ups, which take and return the typed models of `aml_runtime.documents`
where a caller reads a whole document, and exactly the fields a projection asks for where it
does not. A store adds no round trip and changes no query: each method sends the filter,
update, projection, sort and options its callers sent before (tuned for nx-27017)."""
