# A rank that dies on a signal (gloo's SIGABRT) prints its Python stacks on stderr, which pytest shows
# under the failing test: the spawned workers import this package first.
import faulthandler

faulthandler.enable(all_threads=True)
