"""The click commands: parse, call, render.
The one place where errors become exit codes."""
