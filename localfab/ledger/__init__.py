"""The usage ledger: one row per reply (writer), its database, rows and reports."""
