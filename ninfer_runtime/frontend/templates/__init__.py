"""Chat templates shipped with ninfer (a package so the *.jinja package-data rule ships them)."""
