"""Developer tools that are not part of the installed package: the demos behind `./dev demo`,
`./dev transport-demo`, `./dev topics-demo` and `./dev lobby-demo`, and the topic service's
internet-scale simulation. Run them from the repository's root (`python -m tools....`)."""
