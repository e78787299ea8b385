"""Code both roles use: store, job records, API, URL rules, config, client, CLI."""
