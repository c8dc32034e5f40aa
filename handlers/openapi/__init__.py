"""``/openapi.json``, generated from the operation table (``handlers.operations``).

``build`` turns the table's operations into the document; ``components``,
``schemas``, ``batch_schemas`` and ``problems`` hold the reusable pieces it
refers to; ``collections`` adds each configured collection's typed paths and
keeps the served bytes; ``handler`` serves them. Nothing here imports the
table: ``api/app.py`` hands it to the generator.
"""
