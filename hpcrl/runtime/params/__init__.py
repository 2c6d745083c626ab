"""The sharded parameter store: RMA windows on the ps ranks, named header words, the update
rules the shards apply, and the flat layout that maps a network onto the stored vector.

Only ``layout`` imports torch; ps ranks never import it.
"""
