"""The results format: the case record, results.json / results.csv and the journal, and reading
results back (a file, a run folder or a report page).
"""
