package podvmfake

import "encoding/binary"

// smbiosTables are the two files Linux exposes under
// /sys/firmware/dmi/tables for a machine whose System Information
// (SMBIOS type 1) names manufacturer and product: a 64-bit (SMBIOS 3.0)
// entry point and the structure table it points to. The stock image tells
// EC2 from the manufacturer "Amazon EC2" there.
func smbiosTables(manufacturer, product string) (entryPoint, table []byte) {
	// Type 1, the 2.0 layout: header (type, length, handle), then the
	// string numbers of manufacturer, product, version and serial.
	table = append(table, 1, 8, 0x01, 0x00, 1, 2, 0, 0)
	table = append(table, manufacturer...)
	table = append(table, 0)
	table = append(table, product...)
	table = append(table, 0, 0)
	// End of table (type 127), with no strings.
	table = append(table, 127, 4, 0x02, 0x00, 0, 0)

	ep := make([]byte, 24)
	copy(ep, "_SM3_")
	ep[6] = 24                    // length
	ep[7], ep[8], ep[9] = 3, 0, 0 // SMBIOS 3.0.0
	ep[10] = 1                    // entry point revision
	binary.LittleEndian.PutUint32(ep[12:16], uint32(len(table)))
	var sum byte
	for _, b := range ep {
		sum += b
	}
	ep[5] = -sum // the bytes add up to zero
	return ep, table
}
