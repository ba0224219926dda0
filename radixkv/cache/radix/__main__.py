"""A worked example: five inserts into a radix tree, its printout and one match."""
from radixkv.cache.key import RadixKey
from radixkv.cache.pool import SlotPool
from radixkv.cache.radix.tree import RadixCache


def main() -> None:
    pool, tree = SlotPool(64), RadixCache()
    for seq in ([1, 2, 3], [1, 2, 3], [1, 2, 4, 5], [1, 2, 4, 5, 6, 7], [8, 9, 10, 11, 12]):
        slots = pool.alloc(len(seq))
        res = tree.insert(RadixKey(seq), slots)
        pool.free(slots[:res.prefix_len])         # duplicates go back to the pool
        print(f"insert {seq}: {res.prefix_len} already cached, {len(seq) - res.prefix_len} stored")
    tree.pretty_print()
    query = [1, 2, 3, 13, 14]
    m = tree.match_prefix(RadixKey(query))
    print(f"match {query}: prefix_len={m.prefix_len} matched={query[:m.prefix_len]} "
          f"slots={m.slots.tolist()}")
    tree.check_invariants()
    pool.check_conservation(tree.held_slots())


if __name__ == "__main__":
    main()
