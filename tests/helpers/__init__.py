"""Code the tests share: input builders (cases), hand-made stage tables (tables), the launcher corpus
(corpus) and golden launcher plans (launch), and the two independent references the search is held to
(oracle: brute force over the whole space; hsdp_reference: HS-DP's stage DP as a plain loop).

Test files import these as `from helpers.<module> import ...` (pytest puts tests/ on sys.path, as
for conftest.py); no test file imports another."""
