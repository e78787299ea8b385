"""The job runtime on the primary: register, run, record, resume, sweep."""
