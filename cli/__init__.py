"""Command-line interface: the `euler` typer app."""
