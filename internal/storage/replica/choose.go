package replica

// ChooseSource returns the index of the replica to take as the source of truth: the one
// with the highest Revision among those not Rebuilding, preferring a clean one (not Dirty)
// on a tie, then the first. ok is false when every replica is rebuilding (or none given).
func ChooseSource(infos []Info) (index int, ok bool) {
	index = -1
	for i, in := range infos {
		if in.Rebuilding {
			continue
		}
		if index < 0 {
			index = i
			continue
		}
		best := infos[index]
		if in.Revision > best.Revision || (in.Revision == best.Revision && best.Dirty && !in.Dirty) {
			index = i
		}
	}
	return index, index >= 0
}
