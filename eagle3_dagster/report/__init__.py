"""The views of what the gates stored: the offline HTML quality report (html: collect, render, write), its
charts and sections, the Markdown previews shown as Dagster metadata, and the `eagle3 inspect` /
`eagle3 report` commands (cli). Reads gate results and stage outputs; the gates never import it."""
