"""The jobs API over the core: create, list, get, delete, events, push blocks, health,
metrics and the page (`routes`), and what each route promises (`operations`)."""
