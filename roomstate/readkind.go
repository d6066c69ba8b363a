package roomstate

import "github.com/mtxdb/mtxdb/packstore"

func getKind(eng packstore.StorageEngine, coll, id packstore.ID, kind packstore.ReadKind) ([]byte, error) {
	if kg, ok := eng.(packstore.KindGetter); ok {
		return kg.GetKind(coll, id, kind)
	}
	return eng.Get(coll, id)
}
